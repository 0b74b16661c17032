#!/usr/bin/env bash
# On the GPU machine, call 2 of round 32 (#21, #29): round 31's checks
# (scripts/gpu_call_round31.sh: the cuBLASLt descriptors built once, graph_check --rows-check,
# prefill with and without the row classes, decode defaults, the lockstep engine check on the
# 4-layer MoE shape), then MoE decode on 4 of 48 layers (GQA 8 as two group-4 halves, clusters
# of 8, ~80 tokens a block) with and without --fused-fetch8 2.
set -u
source scripts/gpu_lib.sh
bash scripts/gpu_call_round31.sh
for v in "" "--fused-fetch8 2" "" "--fused-fetch8 2"; do
  timeout 90 .gpu/bench --model-dir /tmp/m-moe4 --no-peer --batches 1,2 --new 64 --prompt 256 $v > "$OUT/bm.log" 2>&1
  echo "== moe4 ${v:-default} rc $?"; grep -E "^ours decode|Error" "$OUT/bm.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done
