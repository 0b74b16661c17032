#!/usr/bin/env bash
# On the GPU machine, call 5 of round 38 (#21, #29): the fused attention's tensor-core kernels
# only for steps whose contexts all fit one cluster (eager: StepInputs::short_ctx; graphs: a
# second graph for the buckets of up to --fused-mma-rows rows, replayed when the longest
# context fits), the CUDA-core kernels (96 registers) past it. Call 4 ran the tensor-core
# kernel for every context (its CUDA-core fallback at 113 registers lost 23-33% after 8k-32k).
# 1. graph_check with --fused-mma 2 --fused-mma-rows 1 and --fused-mma 1 (short graphs against
#    eager steps, which choose alike);
# 2. decode rows default / mma2 rows 1 / mma1 rows 2: 0.6B at 512, 2k, 8k, 32k; 1.7B; MoE.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; moe_model 4; echo "models t=$((SECONDS - T0))"
A="--fused-mma 2 --fused-mma-rows 1"; B="--fused-mma 1"
for v in "" "$A" "$B"; do
  row "0.6b p512 [$v]" --model-dir /tmp/m-0.6b --batches 1,2,4,8 $v
  row "0.6b p2000 [$v]" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1,2 --new 64 $v
  row "1.7b p512 [$v]" --model-dir /tmp/m-1.7b --batches 1,2 $v
done
for v in "" "$A"; do
  row "0.6b p8000 [$v]" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,2 --new 64 $v
  row "moe4 p256 [$v]" --model-dir /tmp/m-moe4 --prompt 256 --new 64 --batches 1,2 $v
  row "1.7b p8000 [$v]" --model-dir /tmp/m-1.7b --prompt 8000 --batches 1 --new 64 $v
done
row "0.6b p32000 [$A]" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1 --new 32 $A
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1500 $A > "$OUT/gc.log" 2>&1
echo "== gc A rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -12
left 400 && { timeout 60 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 $B > "$OUT/gcb.log" 2>&1;
  echo "== gc B rc $? t=$((SECONDS - T0))"; grep -E "graph-check|FAIL" "$OUT/gcb.log" | head -4; }
echo "done t=$((SECONDS - T0))"
