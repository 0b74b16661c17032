#!/usr/bin/env bash
# On the GPU machine, call 6 of round 38 (#21): call 5 measured batches 4 and 8 1.5-3% slower
# with --fused-mma on (their steps do not take it; they ran after batches 1-2, which did):
# batches 8 and 4 first, default against --fused-mma 2 --fused-mma-rows 1, then 1 before 8.
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
A="--fused-mma 2 --fused-mma-rows 1"
row "0.6b p512 [] 8,4" --model-dir /tmp/m-0.6b --batches 8,4
row "0.6b p512 [$A] 8,4" --model-dir /tmp/m-0.6b --batches 8,4 $A
row "0.6b p512 [$A] 1,8" --model-dir /tmp/m-0.6b --batches 1,8 $A
row "0.6b p512 [] 1,8" --model-dir /tmp/m-0.6b --batches 1,8
echo "done t=$((SECONDS - T0))"
