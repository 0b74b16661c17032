#!/usr/bin/env bash
# On the GPU machine, call 2 of round 36 (#21, #29).
# 1. kernel_check --fp8-only with the two-stage ring (the fp8 fused cases through both rings;
#    the engine over fp8 KV with it).
# 2. MoE (30B-A3B shape, 4 of 48 layers): batches 1, 2, 8, default against --fused-ring 2.
# 3. Batch 8 fresh against after a 1-row round (round 34: 1.476 against 1.355 ms a step): the
#    engine's step profile (GPU busy / idle a step, every 32 steps).
# 4. The ops of a step at batches 1 and 8 (20 launches of one op in a graph).
# 5. The batch-8 fused attention after 600 tokens and the 1-row one after 8k under ncu.
set -u
source scripts/gpu_lib.sh
model 0.6b; moe_model 4; echo "models t=$((SECONDS - T0))"
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --fp8-only --fused-ring 2 > "$OUT/kc8.log" 2>&1
echo "== kc fp8 ring2 rc $? t=$((SECONDS - T0))"; grep -E "^kernel-check|FAIL|Error|panic" "$OUT/kc8.log" | head -8
echo "fp8 ring checks ok: $(grep -c "ring. .* ok" "$OUT/kc8.log")"
for v in "" "--fused-ring 2" "" "--fused-ring 2"; do
  row "moe4 p256 ${v:-default}" --model-dir /tmp/m-moe4 --prompt 256 --new 64 --batches 1,2,8 $v
done
for bs in 8 1,8; do
  left 400 || break
  RUST_LOG=policy_serve=info timeout 60 .gpu/bench --no-peer --model-dir /tmp/m-0.6b --batches $bs \
    --new 256 --profile-steps 32 > "$OUT/p$bs.log" 2>&1
  echo "== profile batches $bs rc $?: $(grep -E "^ours decode" "$OUT/p$bs.log" | sed 's/ours decode batch //' | paste -sd' ')"
  grep "step profile" "$OUT/p$bs.log" | grep "running=8" | tail -2 | sed "s/.*running=/running=/" | cut -c1-300
done
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,8 > "$OUT/prof.log" 2>&1
echo "== ops profile rc $? t=$((SECONDS - T0))"; grep -vE "^\s*$" "$OUT/prof.log" | cut -c1-150 | head -60
NCU=/usr/local/cuda/bin/ncu
[ -x "$NCU" ] || NCU=$(command -v ncu)
STALLS=$(for r in long_scoreboard barrier wait lg_throttle membar short_scoreboard drain \
  no_instruction math_pipe_throttle mio_throttle not_selected selected dispatch_stall sleeping; do
  printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' $r; done | sed 's/,$//')
for pb in 600:8 8000:1; do
  p=${pb%:*}; bb=${pb#*:}
  left 480 || break
  timeout 100 "$NCU" --clock-control none --cache-control none -k regex:decode_fused --launch-skip 300 \
    --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats \
    --metrics "dram__bytes_read.sum,gpu__time_duration.sum,$STALLS" -o "$OUT/ncu-att$p-b$bb" -f \
    .gpu/bench --model-dir /tmp/m-0.6b --no-peer --prompt $p --batches $bb --new 40 --warmup-new 2 \
    > "$OUT/ncu-att$p-b$bb.log" 2>&1
  echo "== ncu attention p$p b$bb rc $?"
  "$NCU" --import "$OUT/ncu-att$p-b$bb.ncu-rep" --csv --page details > "$OUT/ncu-att$p-b$bb.csv" 2>/dev/null
  python3 scripts/ncu_table.py "$OUT/ncu-att$p-b$bb.csv"
done
echo "done t=$((SECONDS - T0))"
