#!/usr/bin/env bash
# Round 58, call 2 (#21): the 2-row streamed gate|up's whole-row loops folded into the default
# builds (round 57's `--gemv-stream-pipe` forms at 2 rows, measured +4.8% / +3.8% at batch 2 on
# an H100 in call 1). kernel_check --gemv-only (the folded kernels against the
# one-block-a-row-group ones, bit for bit), graph_check's stress run on 1.7B, then the floors'
# rows on the defaults after 512-token prompts: 1.7B and 0.6B batches 1, 2, 8, three rounds;
# on an H200 the 30B-A3B shape whole (48 layers) at batch 1 if time is left.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round58a.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
sweep d17 110 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
sweep d06 80 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
left 400 && kc gemv 120 --model-dir /tmp/m-1.7b --gemv-only
left 430 && { timeout "$(cap 80)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
case $gpu in *H200*) left 330 && moe48_sweep 150 "--prompt 512 --batches 1 --new 128 --variant-rounds 2" "" ;; esac
echo "done t=$((SECONDS - T0))"
