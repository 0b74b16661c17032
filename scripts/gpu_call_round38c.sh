#!/usr/bin/env bash
# On the GPU machine, call 3 of round 38 (#21, #29): the tensor-core loop of the fused decode
# attention at four blocks an SM (--fused-mma 1: 128 registers, q's fragment from shared memory
# each chunk; call 2 ran it at 130 registers, three blocks an SM, and lost at batches 4-16 and
# after 8k at batch 1), and --fused-mma 2 (113 registers, two blocks an SM by shared memory).
# 1. kernel_check --model-only (every fused case on both against the unfused tensor-core
#    kernels), graph_check with --fused-mma 1;
# 2. decode rows default / mma1 / mma2: 0.6B at 512 and 8k, 1.7B at 512 and 8k, 0.6B at 32k,
#    MoE 4 of 48 layers, the 1-row graph at 32 partitions with mma1 after 8k.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; moe_model 4; echo "models t=$((SECONDS - T0))"
kc kc 120 --model-dir /tmp/m-mix --model-only
for v in "" "--fused-mma 1" "--fused-mma 2"; do
  row "0.6b p512 [$v]" --model-dir /tmp/m-0.6b --batches 1,2,4,8,16 $v
done
for v in "" "--fused-mma 1" "--fused-mma 2"; do
  row "0.6b p8000 [$v]" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,2,4,8 --new 64 $v
done
row "0.6b p8000 [--fused-mma 1 --graph-splits-one 32]" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1 --new 64 --fused-mma 1 --graph-splits-one 32
for v in "" "--fused-mma 1"; do
  row "1.7b p512 [$v]" --model-dir /tmp/m-1.7b --batches 1,2,4,8 $v
  row "1.7b p8000 [$v]" --model-dir /tmp/m-1.7b --prompt 8000 --batches 1,4,8 --new 64 $v
  row "moe4 p256 [$v]" --model-dir /tmp/m-moe4 --prompt 256 --new 64 --batches 1,2,8 $v
done
row "0.6b p32000 [--fused-mma 1]" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1,4 --new 32 --fused-mma 1
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 800 --fused-mma 1 > "$OUT/gc.log" 2>&1
echo "== gc mma1 rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -12
left 520 && { timeout 40 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 8 --fused-mma 1 > "$OUT/prof8.log" 2>&1;
  grep -E "paged_decode|fused decode|fused attention|step" "$OUT/prof8.log" | cut -c1-140 | head -10; }
echo "done t=$((SECONDS - T0))"
