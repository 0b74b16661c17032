#!/usr/bin/env bash
# On the GPU machine, call 1 of round 34 (#21): the variants built without a GPU in rounds 32-34,
# most valuable first, each run stopped from starting past ~540 s of the call.
# 1. Long 1-row partitions at 8k and 32k tokens of context: --fused-fetch8 2 and
#    --fused-pipelined 2 against the default, batches 1 and 2, 0.6B and 1.7B.
# 2. The 5-16-row graphs in 8 partitions (--graph-splits-mid 8) against 16: batches 8 and 16
#    after 512-token prompts, batch 8 after 8k.
# 3. kernel_check --model-only (every fused case with fetch8 and pipelined as well).
# 4. --fused-pipelined 2 after 512-token prompts.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
for p in 32000 8000; do for s in 0.6b 1.7b; do for v in "" "--fused-fetch8 2" "--fused-pipelined 2"; do
  row "$s p$p ${v:-default}" --model-dir /tmp/m-$s --prompt $p --batches 1,2 --new 64 $v
done; done; done
for s in 0.6b 1.7b; do for v in "" "--graph-splits-mid 8" "" "--graph-splits-mid 8"; do
  row "$s p512 ${v:-default}" --model-dir /tmp/m-$s --batches 8,16 $v
done; done
for v in "" "--graph-splits-mid 8"; do
  row "0.6b p8000 ${v:-default}" --model-dir /tmp/m-0.6b --prompt 8000 --batches 8 --new 64 $v
done
if left 420; then
  mix_model
  timeout 150 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
  echo "== kc rc $? t=$((SECONDS - T0))"; grep -E "^kernel-check|FAILED|Error|panic" "$OUT/kc.log" | head -8
  grep -ciE "pipelined|p2" "$OUT/kc.log"
fi
for s in 0.6b 1.7b; do for v in "" "--fused-pipelined 2"; do
  row "$s p512 ${v:-default}" --model-dir /tmp/m-$s --batches 1,2 $v
done; done
echo "done t=$((SECONDS - T0))"
