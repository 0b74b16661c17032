#!/usr/bin/env bash
# Round 59, call 2 (#21): the staged 1-row gate|up on by default (call 1: 1.7B batch 1 +2.0% on
# an H100), beside it off (`--no-gemv-stream-stage`) and with the third batch prefetched into L2
# as well (`--gemv-stream-stage-l2`). kernel_check --gemv-only (the staged kernels' bits, with and
# without the prefetch, against the one-block-a-row-group kernels), then 1.7B and 0.6B batches
# 1, 2, 8 after 512-token prompts, three interleaved rounds (the defaults' column is the floors'
# row on an H200); graph_check's stress run on the defaults.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round59b.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "stage" "stage"
counted "$OUT/gemv.log" "entries loaded" "entries loaded"
sweep d17 200 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--no-gemv-stream-stage" "--gemv-stream-stage-l2"
sweep d06 100 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
left 400 && { timeout "$(cap 80)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 \
  > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
case $gpu in *H200*) left 330 && moe48_sweep 150 "--prompt 512 --batches 1 --new 128 --variant-rounds 2" "" ;; esac
echo "done t=$((SECONDS - T0))"
