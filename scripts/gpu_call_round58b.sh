#!/usr/bin/env bash
# Round 58, call 3 (#21): the streamed gate|up at 2,048 inputs with the rows past each warp's
# first two from a queue (`--gemv-stream-queue`). kernel_check --gemv-only (its bits against the
# one-block-a-row-group kernels at 1-3 blocks an SM, two passes), the 1.7B rows after 512-token
# prompts with it beside the defaults (batches 1, 2, 8, three interleaved rounds), graph_check's
# stress run with it; on an H200 the 0.6B floors' rows and the 30B-A3B shape whole if time is
# left. Run as `export OUT BUDGET=...; bash scripts/gpu_call_round58b.sh` on the binaries of
# 7a84a2d (the option was measured slower and removed after this call: BENCHMARKS.md round 58).
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 1.7b; echo "model t=$((SECONDS - T0))"
kc gemv 90 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "queue" "queue"
sweep d17 110 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-stream-queue"
left 300 && { timeout "$(cap 70)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 --gemv-stream-queue > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
case $gpu in *H200*)
  left 300 && { model 0.6b; sweep d06 70 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""; }
  left 300 && moe48_sweep 150 "--prompt 512 --batches 1 --new 128 --variant-rounds 2" "" ;;
esac
echo "done t=$((SECONDS - T0))"
