#!/usr/bin/env bash
# On the GPU machine, call 1 of round 38 (#21), on round 36's final defaults (commit 82b674b's
# binaries): graph_check with the defaults (fused_lean on: not yet run), the step's ops at
# batches 1 and 8 (the tensor-core paged_decode beside the fused attention), and decode rows
# with the fused attention against the unfused kernels (tensor-core attention, three launches).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 3000 > "$OUT/gc.log" 2>&1
echo "== gc rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -12
for b in 1 8; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-0.6b --profile $b > "$OUT/prof$b.log" 2>&1
  echo "== prof $b rc $? t=$((SECONDS - T0))"
  grep -E "paged_decode|fused decode|fused attention|qk_norm|reduce|step" "$OUT/prof$b.log" | cut -c1-140 | head -14
done
row "0.6b p512" --model-dir /tmp/m-0.6b --batches 1,2,4,8,16
row "0.6b p512 unfused" --model-dir /tmp/m-0.6b --batches 1,2,4,8,16 --no-fused-decode
row "1.7b p512" --model-dir /tmp/m-1.7b --batches 1,4,8,16
row "1.7b p512 unfused" --model-dir /tmp/m-1.7b --batches 1,4,8,16 --no-fused-decode
row "0.6b p8000" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,4,8 --new 64
row "0.6b p8000 unfused" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,4,8 --new 64 --no-fused-decode
echo "done t=$((SECONDS - T0))"
