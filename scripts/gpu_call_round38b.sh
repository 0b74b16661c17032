#!/usr/bin/env bash
# On the GPU machine, call 2 of round 38 (#21): the fused decode attention's loop on tensor
# cores (--fused-mma 1 / 2, off by default). Call 1 (gpu_call_round38.sh) found the unfused
# tensor-core attention (three launches) faster than the fused CUDA-core kernel after 8k-token
# prompts (0.6B batch 8 2,663 against 2,033 tok/s) and at batch 16.
# 1. kernel_check --model-only (every fused case on mma1 / mma2 against the unfused tensor-core
#    kernels, bits), decode rows default / mma1 / mma2 at 512, 8k, 32k, 1.7B;
# 2. graph_check with --fused-mma 1, the ops at batch 8, --fp8-only, --mma-only (decode_mma.cu's
#    helpers moved into decode_mma.cuh).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
kc kc 120 --model-dir /tmp/m-mix --model-only
grep -E "mma[12].*(FAIL|fail)" "$OUT/kc.log" | head -5
for v in "" "--fused-mma 1" "--fused-mma 2"; do
  row "0.6b p512 [$v]" --model-dir /tmp/m-0.6b --batches 1,2,4,8,16 $v
done
for v in "" "--fused-mma 1" "--fused-mma 2"; do
  row "0.6b p8000 [$v]" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,4,8 --new 64 $v
done
for v in "" "--fused-mma 1" "--fused-mma 2"; do
  row "1.7b p512 [$v]" --model-dir /tmp/m-1.7b --batches 1,4,8,16 $v
done
for v in "" "--fused-mma 2"; do
  row "0.6b p32000 [$v]" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1,4 --new 32 $v
done
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1500 --fused-mma 1 > "$OUT/gc.log" 2>&1
echo "== gc mma1 rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -12
for v in 1 2; do
  timeout 40 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 8 --fused-mma $v > "$OUT/prof8-$v.log" 2>&1
  echo "== prof 8 mma$v rc $? t=$((SECONDS - T0))"
  grep -E "paged_decode|fused decode|fused attention|step" "$OUT/prof8-$v.log" | cut -c1-140 | head -10
done
left 480 && kc kcf 60 --model-dir /tmp/m-0.6b --fp8-only
left 500 && kc kcm 80 --model-dir /tmp/m-0.6b --mma-only
echo "done t=$((SECONDS - T0))"
