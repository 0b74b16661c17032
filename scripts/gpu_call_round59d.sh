#!/usr/bin/env bash
# Round 59, call 4 (#21): the 1-row qkv on streamed rows, one block an SM held to 64 registers
# with three batches a warp staged in shared memory before its wait (`--gemv-qkv-stage`,
# s{norm}_gemv_st3_t1_bf16) beside the defaults. kernel_check --gemv-only (its bits against the
# one-block-a-row-group kernels), then 1.7B and 0.6B batches 1, 2, 8 after 512-token prompts,
# three interleaved rounds (the defaults' column is the floors' row on an H200); graph_check's
# stress run with it on.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round59d.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "qkv stage" "qkv stage"
counted "$OUT/gemv.log" "loaded" "entries loaded"
sweep d17 160 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-qkv-stage"
sweep d06 120 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-qkv-stage"
left 400 && { timeout "$(cap 80)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 \
  --gemv-qkv-stage > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
case $gpu in *H200*) left 330 && moe48_sweep 150 "--prompt 512 --batches 1 --new 128 --variant-rounds 2" "" ;; esac
echo "done t=$((SECONDS - T0))"
