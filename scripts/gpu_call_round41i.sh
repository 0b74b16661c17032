#!/usr/bin/env bash
# Round 41, call 9: the widest 1-2-row matmuls on cuBLAS in a step (--gemv-max-k N; off):
# 1.7B's down (6,144 inputs) with N = 4,096, 0.6B's down (3,072) with N = 2,048, against the
# default, interleaved, batches 1 and 2 after 512 tokens (call 8's op table: 1.7B down alone
# 9.9 us ours, 8.8-8.9 cuBLAS).
set -u
source scripts/gpu_lib.sh
model 1.7b; model 0.6b; echo "models t=$((SECONDS - T0))"
for r in 1 2; do
  row "1.7b p512 run $r []" --model-dir /tmp/m-1.7b --prompt 512 --batches 1,2 --new 128
  row "1.7b p512 run $r [--gemv-max-k 4096]" --model-dir /tmp/m-1.7b --prompt 512 --batches 1,2 --new 128 --gemv-max-k 4096
  row "0.6b p512 run $r []" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128
  row "0.6b p512 run $r [--gemv-max-k 2048]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 --gemv-max-k 2048
done
echo "done t=$((SECONDS - T0))"
