#!/usr/bin/env bash
# On the GPU machine, call 2 of round 36 (#21, #29), on the committed defaults: the K/V ring
# removed, the unnormed tensor-core skinny matmuls on for weights of up to 6Mi elements
# (`KernelOptions::gemv_mma_plain`; `--no-gemv-mma-plain` turns them off).
# 1. kernel_check --gemv-only (its dispatch against the paths it takes, bit for bit),
#    --model-only (MoE shapes: the router's 3-8-row matmul takes it), graph_check.
# 2. Decode, default against --no-gemv-mma-plain, two runs: 0.6B and 1.7B after 512-token
#    prompts (the floors), batches 4 and 8 after 8k; MoE 4 of 48 layers.
# 3. Batch 8 fresh against after a 1-row round (round 34: 1.476 against 1.355 ms a step): the
#    engine's step profile (GPU busy / idle a step, every 32 steps).
# 4. The ops of a step at batches 1 and 8; the batch-8 fused attention under ncu.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; moe_model 4; echo "models t=$((SECONDS - T0))"
kc kcg 100 --model-dir /tmp/m-0.6b --gemv-only
echo "dispatch checks ok: $(grep -c "gemv_mma_plain.* ok" "$OUT/kcg.log")"
kc kc 120 --model-dir /tmp/m-mix --model-only
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1500 > "$OUT/gc.log" 2>&1
echo "== gc rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -12
for r in 1 2; do
  for s in 0.6b 1.7b; do
    for v in "" "--no-gemv-mma-plain"; do
      row "$s p512 ${v:-default} run $r" --model-dir /tmp/m-$s --batches 1,2,8 $v
    done
  done
done
for s in 0.6b 1.7b; do
  for v in "" "--no-gemv-mma-plain"; do
    row "$s p8000 ${v:-default}" --model-dir /tmp/m-$s --prompt 8000 --batches 4,8 --new 64 $v
  done
done
for v in "" "--no-gemv-mma-plain"; do
  row "moe4 p256 ${v:-default}" --model-dir /tmp/m-moe4 --prompt 256 --new 64 --batches 1,2,8 $v
done
for bs in 8 1,8; do
  left 420 || break
  RUST_LOG=policy_serve=info timeout 60 .gpu/bench --no-peer --model-dir /tmp/m-0.6b --batches $bs \
    --new 256 --profile-steps 32 > "$OUT/p$bs.log" 2>&1
  echo "== profile batches $bs rc $?: $(grep -E "^ours decode" "$OUT/p$bs.log" | sed 's/ours decode batch //' | paste -sd' ')"
  grep "step profile" "$OUT/p$bs.log" | grep "running=8" | tail -2 | sed "s/.*running=/running=/" | cut -c1-300
done
left 450 && { timeout 90 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,8 > "$OUT/prof.log" 2>&1
  echo "== ops profile rc $? t=$((SECONDS - T0))"; grep -vE "^\s*$" "$OUT/prof.log" | cut -c1-150 | head -60; }
NCU=/usr/local/cuda/bin/ncu
[ -x "$NCU" ] || NCU=$(command -v ncu)
STALLS=$(for r in long_scoreboard barrier wait lg_throttle membar short_scoreboard drain \
  no_instruction math_pipe_throttle mio_throttle not_selected selected; do
  printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' $r; done | sed 's/,$//')
for pb in 600:8; do
  p=${pb%:*}; bb=${pb#*:}
  left 480 || break
  timeout 80 "$NCU" --clock-control none --cache-control none -k regex:decode_fused --launch-skip 300 \
    --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --metrics "dram__bytes_read.sum,gpu__time_duration.sum,$STALLS" \
    -o "$OUT/ncu-att$p-b$bb" -f .gpu/bench --model-dir /tmp/m-0.6b --no-peer --prompt $p \
    --batches $bb --new 40 --warmup-new 2 > "$OUT/ncu-att$p-b$bb.log" 2>&1
  echo "== ncu attention p$p b$bb rc $?"
  "$NCU" --import "$OUT/ncu-att$p-b$bb.ncu-rep" --csv --page details > "$OUT/ncu-att$p-b$bb.csv" 2>/dev/null
  python3 scripts/ncu_table.py "$OUT/ncu-att$p-b$bb.csv"
done
echo "done t=$((SECONDS - T0))"
