#!/usr/bin/env bash
# Round 43, call 10: the streamed 1-row matmul on 2,049-4,096 inputs only (0.6B's down):
# kernel_check --gemv-only (its bits against gemv.cu's at 1, 4, 10 pieces a warp), then batch
# 1 after 512-token prompts, --gemv-tma 4 beside the default, two interleaved runs on 0.6B.
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
kc gemv 100 --model-dir /tmp/m-0.6b --gemv-only
echo "gemv_tma checks: $(grep -c "gemv_tma" "$OUT/gemv.log"), failed: $(grep "gemv_tma" "$OUT/gemv.log" | grep -c FAIL)"
grep "gemv_tma" "$OUT/gemv.log" | head -3 | cut -c1-120
for r in 1 2; do
  for v in "" "--gemv-tma 4"; do
    row "0.6b p512 b1,2 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
  done
done
row "0.6b p2k b1 [--gemv-tma 4]" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1 --new 128 --gemv-tma 4
row "0.6b p2k b1 []" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1 --new 128
echo "done t=$((SECONDS - T0))"
