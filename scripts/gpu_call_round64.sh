#!/usr/bin/env bash
# Round 64 (#21): the streamed lm_head of 1-row steps and the greedy graphs' one-launch head on
# by default (8 pieces). On any card: 0.6B and 1.7B batches 1 / 8 with the defaults beside
# --no-gemv-tma-head (cuBLAS's head, round 63's defaults), three interleaved rounds (on an H200
# these are the floors' rows); then kernel_check --gemv-only (the lm_head checks and the
# model-level checks with the new defaults), --lora-only (LoRA graphs vs eager) and
# graph_check's graphs / pipelined / stress runs with the defaults.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round64.sh`.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
sweep f06 130 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" "" \
  "--no-gemv-tma-head"
sweep f17 90 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" "" \
  "--no-gemv-tma-head"
left && kc kcg 120 --model-dir /tmp/m-0.6b --gemv-only && counted "$OUT/kcg.log" "lm_head" "lm_head"
left && kc kcl 90 --model-dir /tmp/m-0.6b --lora-only
left && { timeout "$(cap 90)" .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 \
  > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
