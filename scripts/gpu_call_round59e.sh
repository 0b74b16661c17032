#!/usr/bin/env bash
# Round 59, call 6 (#21): the staged 1-row gate|up with the first half of each warp's third
# batch staged too (`--gemv-stream-stage-half`, *_sth_*, 96 KB of stages a block) beside the
# defaults (one batch staged). kernel_check --gemv-only (its bits against the
# one-block-a-row-group kernels), then 1.7B batches 1, 2, 8 after 512-token prompts, three
# interleaved rounds, and 0.6B's on the defaults (the defaults' columns are the floors' rows
# on an H200); graph_check's stress run with it on.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round59e.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "half true" "half stage"
counted "$OUT/gemv.log" "loaded" "entries loaded"
sweep d17 160 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-stream-stage-half"
sweep d06 80 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
left 330 && { timeout "$(cap 80)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 \
  --gemv-stream-stage-half > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
