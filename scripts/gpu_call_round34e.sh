#!/usr/bin/env bash
# On the GPU machine, call 5 of round 34 (#21): call 4 found batch 8 ~8% faster only after a
# batch-1 round (1,2,8: 1.357 ms a step; 8, 8,8 and 2,8: 1.472-1.477). Which part of the engine
# keeps the difference: graphs, pipelined decode, the round order.
set -u
source scripts/gpu_lib.sh
b() {
  local l=$1; shift
  timeout 90 .gpu/bench --no-peer "$@" > "$OUT/b.log" 2>&1
  echo "== $l rc $?: $(grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/ours decode batch //; s/; prefill of batch/ pf/' | paste -sd' ')"
}
model 0.6b
b "1,8" --model-dir /tmp/m-0.6b --batches 1,8
b "8,1,8" --model-dir /tmp/m-0.6b --batches 8,1,8
b "8 no-pipelined" --model-dir /tmp/m-0.6b --batches 8 --no-pipelined-decode
b "1,8 no-pipelined" --model-dir /tmp/m-0.6b --batches 1,8 --no-pipelined-decode
b "8 eager (graphs to 4)" --model-dir /tmp/m-0.6b --batches 8 --max-graph-batch 4
b "1,8 eager (graphs to 4)" --model-dir /tmp/m-0.6b --batches 1,8 --max-graph-batch 4
b "3,8" --model-dir /tmp/m-0.6b --batches 3,8
