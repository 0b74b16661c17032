#!/usr/bin/env bash
# On the GPU machine, one call (#21): the decode layer kernel by phase (graph_check --profile 1
# --layer-kernel: each phase's cumulative time, the barriers alone, polls with and without a
# sleep) on 0.6B and 1.7B, beside the five launches' ops and the whole step on the graphs.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b
for s in 0.6b 1.7b; do
  timeout 200 .gpu/graph_check --model-dir /tmp/m-$s --profile 1 --layer-kernel ${PF:-0} > "$OUT/prof-$s.log" 2>&1
  echo "== profile $s rc $?"; grep -E "^\| |graph replay|sum of ops|Error|panic" "$OUT/prof-$s.log" | grep -v "^| op \|^|---" | head -40
done
