#!/usr/bin/env bash
# On the GPU machine, call 5 of round 34 (#21): call 4 found batch 8 ~8% faster only after a
# batch-1 round (1,2,8: 1.357 ms a step; 8, 8,8 and 2,8: 1.472-1.477). Which part of the engine
# keeps the difference: graphs, pipelined decode, the round order.
set -u
source scripts/gpu_lib.sh
model 0.6b
row "1,8" --model-dir /tmp/m-0.6b --batches 1,8
row "8,1,8" --model-dir /tmp/m-0.6b --batches 8,1,8
row "8 no-pipelined" --model-dir /tmp/m-0.6b --batches 8 --no-pipelined-decode
row "1,8 no-pipelined" --model-dir /tmp/m-0.6b --batches 1,8 --no-pipelined-decode
row "8 eager (graphs to 4)" --model-dir /tmp/m-0.6b --batches 8 --max-graph-batch 4
row "1,8 eager (graphs to 4)" --model-dir /tmp/m-0.6b --batches 1,8 --max-graph-batch 4
row "3,8" --model-dir /tmp/m-0.6b --batches 3,8
