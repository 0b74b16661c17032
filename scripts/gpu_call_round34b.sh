#!/usr/bin/env bash
# On the GPU machine, call 2 of round 34 (#21), on the binaries of call 1.
# 1. Batch 8 after 512-token prompts as round 32 ran it (--batches 1,2,8; call 1's --batches
#    8,16 read 5,421-5,435 against round 32's 5,864-5,877).
# 2. --graph-splits-mid 8 against 16 at 8k (batches 8, 16) and 32k (batch 8).
# 3. --graph-splits-few 16 against 32: batches 3, 4 at 512, 8k, 32k.
# 4. --eager-graph-splits: eager rows at 8k / 32k (--compare-eager), a mixed step.
# 5. graph_check with the three on together.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
row "0.6b p512 b1,2,8" --model-dir /tmp/m-0.6b --batches 1,2,8
row "0.6b p512 b8" --model-dir /tmp/m-0.6b --batches 8
row "1.7b p512 b1,2,8" --model-dir /tmp/m-1.7b --batches 1,2,8
for s in 0.6b 1.7b; do for v in "" "--graph-splits-mid 8"; do
  row "$s p8000 ${v:-default}" --model-dir /tmp/m-$s --prompt 8000 --batches 8,16 --new 64 $v
  row "$s p32000 ${v:-default}" --model-dir /tmp/m-$s --prompt 32000 --batches 8 --new 32 $v
done; done
for s in 0.6b 1.7b; do for p in 512 8000 32000; do for v in "" "--graph-splits-few 16"; do
  row "$s p$p ${v:-default}" --model-dir /tmp/m-$s --prompt $p --batches 3,4 --new 64 $v
done; done; done
for p in 8000 32000; do for v in "" "--eager-graph-splits"; do
  row "0.6b p$p ${v:-default}" --model-dir /tmp/m-0.6b --prompt $p --batches 1,4 --new 32 --compare-eager $v
done; done
for v in "" "--eager-graph-splits"; do
  row "mixed ${v:-default}" --model-dir /tmp/m-0.6b --prompt 32000 --mixed --batches 16 $v
done
if left 430; then
  timeout 165 .gpu/graph_check --model-dir /tmp/m-0.6b --graph-splits-mid 8 --graph-splits-few 16 \
    --eager-graph-splits --stress-steps 4000 > "$OUT/gc.log" 2>&1
  echo "== gc rc $? t=$((SECONDS - T0))"; grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-200 | head -14
fi
echo "done t=$((SECONDS - T0))"
