#!/usr/bin/env bash
# Round 59, call 1 (#21): the 1-row streamed gate|up in 4-warp blocks (`--gemv-stream-narrow`:
# a block fits an SM beside the 1-row attention and o, so the gate|up's first weights load
# while the attention runs) and with each warp's second batch staged in shared memory before
# the wait (`--gemv-stream-stage`). kernel_check --gemv-only (their bits against the
# one-block-a-row-group kernels), then 1.7B and 0.6B batches 1, 2, 8 after 512-token prompts,
# the variants beside the defaults, three interleaved rounds (the defaults' column is the
# floors' row on an H200); graph_check's stress run with both on.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round59a.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "narrow" "narrow/stage"
counted "$OUT/gemv.log" "entries loaded" "entries loaded"
sweep d17 200 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-stream-narrow" "--gemv-stream-stage" "--gemv-stream-narrow --gemv-stream-stage"
sweep d06 120 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-stream-narrow"
left 430 && { timeout "$(cap 80)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 \
  --gemv-stream-narrow --gemv-stream-stage > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
