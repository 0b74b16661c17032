#!/usr/bin/env bash
# Round 42, call 3 (7c34549's binaries: main's defaults): the batch-1/2 defaults set in earlier
# rounds re-measured against the kernels of today: gate|up blocks an SM (--gemv-stream 1, 3),
# two stages for 2-row steps (--fused-mma 2), 1.7B's deferred norm on its 2,048-wide norms
# (--norm-deferred-max-k 2048) and one stage for its 1-row steps (--fused-mma-one 1).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
for r in 1 2; do
  for v in "" "--gemv-stream 1" "--gemv-stream 3" "--fused-mma 2"; do
    row "0.6b p512 b1,2 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
  done
  for v in "" "--norm-deferred-max-k 2048" "--gemv-stream 1" "--gemv-stream 3" "--fused-mma-one 1"; do
    row "1.7b p512 b1,2 [$v] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1,2 --new 128 $v
  done
done
echo "done t=$((SECONDS - T0))"
