#!/usr/bin/env bash
# Round 59, call 3 (#21): the 1-row down with its third batch staged in shared memory before
# its wait (`--gemv-down-stage`, gemv_db3_t1_bf16: all of 1.7B's down row in flight before the
# wait) beside the defaults (the staged gate|up on). kernel_check --gemv-only (its bits and the
# staged gate|up's against the one-block-a-row-group kernels), then 1.7B batches 1, 2, 8 and
# 0.6B's on the defaults after 512-token prompts, three interleaved rounds (the defaults'
# column is the floors' row on an H200); graph_check's stress run with it on.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round59c.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "stage" "stage"
counted "$OUT/gemv.log" "loaded" "entries loaded"
sweep d17 160 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-down-stage"
sweep d06 100 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
left 400 && { timeout "$(cap 80)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 \
  --gemv-down-stage > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
case $gpu in *H200*) left 330 && moe48_sweep 150 "--prompt 512 --batches 1 --new 128 --variant-rounds 2" "" ;; esac
echo "done t=$((SECONDS - T0))"
