#!/usr/bin/env bash
# On the GPU machine, call 1 of round 32 (#21, #29).
# 1. The fused decode attention with 8 tokens a half-warp in flight (--fused-fetch8 ROWS, off by
#    default): kernel_check --model-only on the mixed MoE model (its fused checks run every case
#    with fetch8 as well, at tolerance 0 where the unfused kernels are exact), the attention op
#    alone (graph_check --profile 1,8) and decode at 1, 2, 8 with and without it.
# 2. Where a decode step's kernels lose bandwidth, read by Nsight Compute instead of inferred:
#    each kernel of one decode step (1.7B batch 1, 0.6B batch 8; bench on the graphs, ncu
#    profiling each graph node alone, L2 flushed, clocks not locked) with its duration, DRAM
#    bytes and throughput, achieved occupancy and its warps' stall reasons
#    (scripts/ncu_table.py). Call 2 (gpu_call_round32b.sh): 0.6B batch 1 and round 31's checks.
set -u
source scripts/gpu_lib.sh
NCU=/usr/local/cuda/bin/ncu
[ -x "$NCU" ] || NCU=$(command -v ncu)
model 0.6b; model 1.7b; mix_model
timeout 150 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
echo "== kc rc $?"; grep -E "^kernel-check|FAILED|Error|panic" "$OUT/kc.log" | head -8
grep -c "fetch8" "$OUT/kc.log"
for v in "" "--fused-fetch8 8"; do
  timeout 90 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,8 $v > "$OUT/prof${v:+-f8}.log" 2>&1
  echo "== profile ${v:-default} rc $?"; grep -iE "attention|fused|step|replay" "$OUT/prof${v:+-f8}.log" | head -8
done
for s in 0.6b 1.7b; do for v in "" "--fused-fetch8 8" "" "--fused-fetch8 8"; do
  timeout 90 .gpu/bench --model-dir /tmp/m-$s --no-peer --batches 1,2,8 $v > "$OUT/b.log" 2>&1
  echo "== decode $s ${v:-default} rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done
STALLS=$(for r in long_scoreboard barrier wait lg_throttle membar short_scoreboard drain \
  no_instruction math_pipe_throttle mio_throttle not_selected selected dispatch_stall sleeping; do
  printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' $r; done | sed 's/,$//')
KRE='regex:^(gemv|norm_gemv|dnorm_gemv|snorm|sdnorm|sgemv|decode_fused|argmax)'
# ncu_step NAME MODEL BATCH COUNT: COUNT launches of a decode step at BATCH rows, after ~20 steps
ncu_step() {
  local name=$1 m=$2 b=$3 n=$4 kre=$KRE extra=(--metrics "dram__bytes_read.sum,gpu__time_duration.sum,$STALLS")
  [ "$b" -gt 2 ] && kre='regex:.'   # cuBLAS, norms, SiLU: every kernel of the step
  timeout 140 "$NCU" --clock-control none --cache-control all -k "$kre" --launch-skip 5000 \
    --launch-count "$n" --section SpeedOfLight --section Occupancy --section LaunchStats "${extra[@]}" \
    -o "$OUT/ncu-$name" -f .gpu/bench --model-dir /tmp/m-$m --no-peer --batches "$b" --new 100 \
    --warmup-new 2 --max-graph-batch 8 > "$OUT/ncu-$name.log" 2>&1
  echo "== ncu $name rc $?"; tail -1 "$OUT/ncu-$name.log" | cut -c1-200
  if [ ! -f "$OUT/ncu-$name.ncu-rep" ]; then  # a stall metric this ncu does not know: without
    timeout 150 "$NCU" --clock-control none --cache-control all -k "$kre" --launch-skip 5000 \
      --launch-count "$n" --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --metrics dram__bytes_read.sum -o "$OUT/ncu-$name" -f .gpu/bench \
      --model-dir /tmp/m-$m --no-peer --batches "$b" --new 100 --warmup-new 2 --max-graph-batch 8 \
      > "$OUT/ncu-$name-b.log" 2>&1
    echo "== ncu $name (no stall metrics) rc $?"; tail -1 "$OUT/ncu-$name-b.log" | cut -c1-200
  fi
  "$NCU" --import "$OUT/ncu-$name.ncu-rep" --csv --page details > "$OUT/ncu-$name.csv" 2>/dev/null
  python3 scripts/ncu_table.py "$OUT/ncu-$name.csv" | tee "$OUT/ncu-$name.txt"
}
# ~230 launches a step at batch 8, ~143 at batch 1 (28 layers x 5, the lm_head, the argmax)
ncu_step 1.7b-b1 1.7b 1 145
ncu_step 0.6b-b8 0.6b 8 235
