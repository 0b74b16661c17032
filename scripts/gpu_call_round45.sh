#!/usr/bin/env bash
# Round 45, call 1: the streamed 1-row matmuls behind the fused norm (--gemv-tma-norm N: qkv;
# --gemv-tma-norm-silu N: gate|up), off by default: kernel_check --gemv-only (tma_norm_bits,
# bit for bit against gemv.cu's norm kernels), then batch 1 after 512-token prompts on 0.6B
# and 1.7B, each variant beside the default, two interleaved runs.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 160 --model-dir /tmp/m-0.6b --gemv-only
echo "gemv_tma checks: $(grep -c "gemv_tma" "$OUT/gemv.log"), failed: $(grep "gemv_tma" "$OUT/gemv.log" | grep -c FAIL)"
echo "gemv_tma_norm checks: $(grep -c "gemv_tma_norm" "$OUT/gemv.log"), failed: $(grep "gemv_tma_norm" "$OUT/gemv.log" | grep -c FAIL)"
grep "gemv_tma_norm" "$OUT/gemv.log" | grep FAIL | head -5
B="--prompt 512 --batches 1 --new 128"
for r in 1 2; do
  row "0.6b [] run $r" --model-dir /tmp/m-0.6b $B
  row "0.6b [norm 4] run $r" --model-dir /tmp/m-0.6b $B --gemv-tma-norm 4
  row "0.6b [norm 2] run $r" --model-dir /tmp/m-0.6b $B --gemv-tma-norm 2
  row "0.6b [silu 6] run $r" --model-dir /tmp/m-0.6b $B --gemv-tma-norm-silu 6
  row "0.6b [silu 4] run $r" --model-dir /tmp/m-0.6b $B --gemv-tma-norm-silu 4
  row "0.6b [norm 4 silu 6] run $r" --model-dir /tmp/m-0.6b $B --gemv-tma-norm 4 --gemv-tma-norm-silu 6
done
for r in 1 2; do
  row "1.7b [] run $r" --model-dir /tmp/m-1.7b $B
  row "1.7b [norm 8] run $r" --model-dir /tmp/m-1.7b $B --gemv-tma-norm 8
  row "1.7b [norm 4] run $r" --model-dir /tmp/m-1.7b $B --gemv-tma-norm 4
  row "1.7b [silu 4] run $r" --model-dir /tmp/m-1.7b $B --gemv-tma-norm-silu 4
  row "1.7b [silu 8] run $r" --model-dir /tmp/m-1.7b $B --gemv-tma-norm-silu 8
  row "1.7b [norm 8 silu 8] run $r" --model-dir /tmp/m-1.7b $B --gemv-tma-norm 8 --gemv-tma-norm-silu 8
done
echo "done t=$((SECONDS - T0))"
