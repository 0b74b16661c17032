#!/usr/bin/env bash
# Round 44, call 7: the streamed 1-row matmul's pieces a warp now that it takes 0.6B's o as
# well as its down: batch 1 after 512-token prompts at 2, 3, 4 (default) and 6, two
# interleaved runs.
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
for r in 1 2; do
  for n in 2 3 4 6; do
    row "0.6b p512 b1 [--gemv-tma $n] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 --gemv-tma $n
  done
done
echo "done t=$((SECONDS - T0))"
