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
chmod +x .gpu/bench_prev
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-0.6b --gemv-only
# ab SHAPE BATCHES: bench_prev and bench in turn, three rounds, their decode rows.
ab() {
  local r b
  for r in 1 2 3; do
    for b in bench_prev bench; do
      left || return
      local extra=""; [ "$b" = bench_prev ] && extra="--gemv-mma-x-stage"
      # shellcheck disable=SC2086 # the flag is a word or nothing
      timeout "$(cap 60)" .gpu/$b --no-peer --model-dir "/tmp/m-$1" --prompt 512 --batches "$2" \
        --new 128 $extra > "$OUT/ab-$1-$b-$r.log" 2>&1
      echo "$1 $b r$r: $(grep -E "^ours decode|Error|panic" "$OUT/ab-$1-$b-$r.log" \
        | sed 's/ours decode batch / b/; s/; prefill of batch.*//' | paste -sd' ')"
    done
  done
}
ab 0.6b 1,2
ab 1.7b 1,2
sweep f06 120 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" "" "--no-gemv-mma-x-stage"
sweep f17 60 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 --variant-rounds 3" ""
left 480 && { timeout "$(cap 90)" .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 \
  > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
