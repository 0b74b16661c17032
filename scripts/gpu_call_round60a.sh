#!/usr/bin/env bash
# Round 60, call 1 (#21): round 59's last variant, the staged 1-row gate|up with its copies
# issued after the wait (`--gemv-stream-stage-late`), beside the defaults and the stage off
# (scripts/gpu_call_round59g.sh's rows), and 0.6B batch 8's attention on knobs that exist:
# the fused attention's tensor-core loop at 3-8 rows (`--fused-mma-rows 8`, last measured
# 23-24% slower in round 45, before round 56 cut those kernels down) and the 5-16-row graphs in
# 16 partitions. kernel_check --gemv-only first; graph_check's stress run with the late stage;
# on an H200 the defaults' columns are the floors' rows, then the 30B-A3B shape if time is left.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round60a.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "late true" "late stage"
counted "$OUT/gemv.log" "loaded" "entries loaded"
sweep d17 200 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-stream-stage-late" "--no-gemv-stream-stage"
sweep d06 80 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
sweep a06 90 "--model-dir /tmp/m-0.6b --prompt 512 --batches 8 --new 128 --variant-rounds 2" "" "--fused-mma-rows 8" "--graph-splits-mid 16" "--fused-mma-rows 8 --graph-splits-mid 16"
left 420 && { timeout "$(cap 80)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 \
  --gemv-stream-stage-late > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
case $gpu in *H200*) left 330 && moe48_sweep 150 "--prompt 512 --batches 1 --new 128 --variant-rounds 2" "" ;; esac
echo "done t=$((SECONDS - T0))"
