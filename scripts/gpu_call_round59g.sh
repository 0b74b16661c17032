#!/usr/bin/env bash
# Round 59 -> 60, the next call (#21): the staged 1-row gate|up with its copies issued after the
# wait (`--gemv-stream-stage-late`, *_stl_*; built in round 59, not yet measured) beside the
# defaults (copies before the wait) and the stage off. kernel_check --gemv-only (its bits
# against the one-block-a-row-group kernels), then 1.7B batches 1, 2, 8 and 0.6B's on the
# defaults after 512-token prompts, three interleaved rounds (the defaults' columns are the
# floors' rows on an H200); graph_check's stress run with it on; on an H200 the 30B-A3B shape
# whole at batch 1 if time is left.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round59g.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "late true" "late stage"
counted "$OUT/gemv.log" "loaded" "entries loaded"
sweep d17 200 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-stream-stage-late" "--no-gemv-stream-stage"
sweep d06 80 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
left 400 && { timeout "$(cap 80)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 \
  --gemv-stream-stage-late > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
case $gpu in *H200*) left 330 && moe48_sweep 150 "--prompt 512 --batches 1 --new 128 --variant-rounds 2" "" ;; esac
echo "done t=$((SECONDS - T0))"
