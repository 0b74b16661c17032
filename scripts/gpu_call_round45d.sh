#!/usr/bin/env bash
# Round 45, call 4 (NOT RUN in round 45: no device was lent after call 2): each op's share of
# the decode step's chain. graph_check --profile-skip captures the engine's graphs without the
# ops of a mask (1 qkv, 2 attention, 4 o, 8 gate|up, 16 down, 32 lm_head + f32 logits; 31 every
# layer op: the embedding, the final norm and the head alone) and replays them: the step's
# time without an op, against the whole step, is what that op costs in the PDL chain (its own
# time less what overlaps the kernels around it). 0.6B at batches 1 and 8, 1.7B at batch 1,
# the 30B-A3B shape on 4 layers at batch 1 (64: MoE norm + router, 128: the experts).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; moe_model 4; echo "models t=$((SECONDS - T0))"
for s in 0.6b:1,8 1.7b:1; do
  m=${s%%:*}; b=${s##*:}
  timeout 150 .gpu/graph_check --model-dir /tmp/m-$m --profile $b --profile-skip 1,2,4,8,16,32,31 \
    > "$OUT/skip-$m.log" 2>&1
  echo "== $m profile-skip rc $? t=$((SECONDS - T0))"
  grep -E "^batch .* graph_pdl (1|1, without)" "$OUT/skip-$m.log" | sed 's/ back to back//; s/; with argmax.*//'
done
timeout 150 .gpu/graph_check --model-dir /tmp/m-moe4 --profile 1 --profile-skip 1,2,4,64,128,32,199 \
  > "$OUT/skip-moe.log" 2>&1
echo "== moe4 profile-skip rc $? t=$((SECONDS - T0))"
grep -E "^batch .* graph_pdl (1|1, without)" "$OUT/skip-moe.log" | sed 's/ back to back//; s/; with argmax.*//'
echo "done t=$((SECONDS - T0))"
