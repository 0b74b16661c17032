#!/usr/bin/env bash
# Round 62, call 2 (#21): the deferred norms' loads issued before any of their sums and stores
# (gemv.cuh norm_rows_deferred, gemv_stream.cuh norm_rows_pre: 0.6B's 1-2-row qkv and gate|up,
# where block 0's res_out stores held each next load behind them, and every block's in the
# streamed gate|up). Same sums in the same order. kernel_check --gemv-only; then this build's
# bench against the build before it (.gpu/bench_prev, 0bfb822's tree before the flag flip: its
# staged tensor-core input turned on by --gemv-mma-x-stage), one process each, three
# interleaved rounds; the floors' rows on this build with and without the staged input;
# graph_check's stress run.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round62b.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-0.6b --gemv-only
ab 0.6b 1,2 --gemv-mma-x-stage
ab 1.7b 1,2 --gemv-mma-x-stage
sweep f06 120 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" "" "--no-gemv-mma-x-stage"
sweep f17 60 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 --variant-rounds 3" ""
left 480 && { timeout "$(cap 90)" .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 \
  > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
