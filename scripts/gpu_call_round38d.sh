#!/usr/bin/env bash
# On the GPU machine, call 4 of round 38 (#21, #29): the fused decode attention's tensor-core
# loop only where a context fits one cluster (up to 2,048 tokens at 1-4 rows), the CUDA-core
# loop past it in the same kernel (its half-warp states over the stages: four blocks an SM at
# 113 registers for --fused-mma 1), in steps of at most --fused-mma-rows rows (default 2).
# Calls 2-3 took the tensor-core loop at every context: +9-12% at batch 1 after 512 tokens,
# -13% after 8k, -10-25% at batches 4-16.
# 1. kernel_check --model-only, --fp8-only (the mma kernels against the unfused tensor-core
#    kernels in one cluster, the CUDA-core ones past it), graph_check with --fused-mma 1;
# 2. decode rows default / --fused-mma 1 (rows 2) / rows 4: 0.6B at 512, 2k, 8k, 32k; 1.7B;
#    MoE 4 of 48 layers.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; moe_model 4; echo "models t=$((SECONDS - T0))"
kc kc 120 --model-dir /tmp/m-mix --model-only
for v in "" "--fused-mma 1" "--fused-mma 1 --fused-mma-rows 4" "--fused-mma 2"; do
  row "0.6b p512 [$v]" --model-dir /tmp/m-0.6b --batches 1,2,4,8 $v
done
for v in "" "--fused-mma 1"; do
  row "0.6b p2000 [$v]" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1,2 --new 64 $v
  row "0.6b p8000 [$v]" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,2,4 --new 64 $v
  row "1.7b p512 [$v]" --model-dir /tmp/m-1.7b --batches 1,2 $v
  row "1.7b p8000 [$v]" --model-dir /tmp/m-1.7b --prompt 8000 --batches 1 --new 64 $v
  row "moe4 p256 [$v]" --model-dir /tmp/m-moe4 --prompt 256 --new 64 --batches 1,2 $v
  row "0.6b p32000 [$v]" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1 --new 32 $v
done
timeout 90 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 800 --fused-mma 1 > "$OUT/gc.log" 2>&1
echo "== gc mma1 rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -12
left 480 && kc kcf 60 --model-dir /tmp/m-0.6b --fp8-only
echo "done t=$((SECONDS - T0))"
