#!/usr/bin/env bash
# Round 44, call 9: the MoE shape's router matmul (128 x 2,048, 1 row) is one the streamed 1-row
# matmul now takes by default (2,048-4,096 inputs, at most 1,024 outputs): the 30B-A3B shape
# on 4 layers, batch 1 after 512-token prompts, default against --gemv-tma-min-k 2049 (the
# router back on the skinny matmuls), two interleaved runs.
set -u
source scripts/gpu_lib.sh
moe_model 4; echo "models t=$((SECONDS - T0))"
for r in 1 2; do
  for v in "" "--gemv-tma-min-k 2049"; do
    row "moe4 p512 b1 [$v] run $r" --model-dir /tmp/m-moe4 --prompt 512 --batches 1 --new 128 $v
  done
done
echo "done t=$((SECONDS - T0))"
