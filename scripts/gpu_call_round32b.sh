#!/usr/bin/env bash
# On the GPU machine, call 2 of round 32 (#21, #29): 0.6B batch 1 under Nsight Compute (as call
# 1, scripts/gpu_call_round32.sh), then round 31's checks (scripts/gpu_call_round31.sh: the
# cuBLASLt descriptors built once, graph_check --rows-check, prefill with and without the row
# classes, the lockstep engine check on the 4-layer MoE shape).
set -u
source scripts/gpu_lib.sh
NCU=/usr/local/cuda/bin/ncu
[ -x "$NCU" ] || NCU=$(command -v ncu)
model 0.6b
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
ncu_step 0.6b-b1 0.6b 1 145
bash scripts/gpu_call_round31.sh
