#!/usr/bin/env bash
# Not run: round 36 ran its checks, the MoE rows, the batch-8 step profile, the ops profile
# and the batch-8 ncu in scripts/gpu_call_round36.sh and 36b.sh (the 1-row ncu at 8k / 32k not).
# On the GPU machine, call 1 of the next round (#21, #29), on the build after the fetch-8 and
# pipelined variants' removal.
# 1. kernel_check --model-only: the fused decode attention as built before round 32's variants
#    (its group-8 bf16 kernel's scheduling differs from rounds 32-34's builds), with the new
#    cases at the graphs' new partition counts (4 rows in 16, 8 rows in 8, over 3,000 tokens);
#    then graph_check (the partition counts now come from CudaKernels::step_splits).
# 2. MoE (30B-A3B shape, 4 of 48 layers; group 8): batches 1, 2, 8 against round 34 call 3
#    (2,335 / 3,797 at batches 1 / 2).
# 3. Batch 8 fresh against after a 1-row round (round 34 calls 4-5: 1.476 against 1.356 ms a
#    step): the engine's step profile (GPU busy / idle and host phases, every 32 steps), to tell
#    whether the slow state is the device or the host.
set -u
source scripts/gpu_lib.sh
model 0.6b; mix_model; moe_model 4
timeout 150 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
echo "== kc rc $?"; grep -E "^kernel-check|FAILED|Error|panic" "$OUT/kc.log" | head -8
grep -E "decode_fused.*(splits 8|splits 16)" "$OUT/kc.log" | head -6
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 3000 > "$OUT/gc.log" 2>&1
echo "== gc rc $?"; grep -E "graph-check|FAIL|engine|shrink" "$OUT/gc.log" | cut -c1-160 | head -8
for r in 1 2; do
  timeout 90 .gpu/bench --no-peer --model-dir /tmp/m-moe4 --prompt 256 --new 64 --batches 1,2,8 > "$OUT/b.log" 2>&1
  echo "== moe4 run $r rc $?: $(grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/ours decode batch //; s/ (.*//' | paste -sd' ')"
done
for bs in 8 1,8; do
  RUST_LOG=policy_serve=info timeout 90 .gpu/bench --no-peer --model-dir /tmp/m-0.6b --batches $bs \
    --new 256 --profile-steps 32 > "$OUT/p.log" 2>&1
  echo "== profile batches $bs rc $?: $(grep -E "^ours decode" "$OUT/p.log" | sed 's/ours decode batch //' | paste -sd' ')"
  grep "step profile" "$OUT/p.log" | grep "running=8" | tail -3 | sed "s/.*running=/running=/" | cut -c1-300
done
# 3b. The ops of a step at batches 1 and 8 on the current defaults (20 launches of one op in a
#     graph): what the next batch-1 / batch-8 work is sized on.
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,8 > "$OUT/prof.log" 2>&1
echo "== ops profile rc $?"; grep -vE "^\s*$" "$OUT/prof.log" | grep -E "us|step|replay" | cut -c1-150 | head -70
# 4. The 1-row fused attention after long prompts under Nsight Compute (L2 not flushed): where
#    a ~500-token partition's 16 rounds go (round 34: ~4.3 us a round at 32k, 1.8 TB/s).
NCU=/usr/local/cuda/bin/ncu
[ -x "$NCU" ] || NCU=$(command -v ncu)
STALLS=$(for r in long_scoreboard barrier wait lg_throttle membar short_scoreboard drain \
  no_instruction math_pipe_throttle mio_throttle not_selected selected dispatch_stall sleeping; do
  printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' $r; done | sed 's/,$//')
for pb in 8000:1 600:8 32000:1; do
  p=${pb%:*}; bb=${pb#*:}
  left 500 || break
  timeout 150 "$NCU" --clock-control none --cache-control none -k regex:decode_fused --launch-skip 300 \
    --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats \
    --metrics "dram__bytes_read.sum,gpu__time_duration.sum,$STALLS" -o "$OUT/ncu-att$p-b$bb" -f \
    .gpu/bench --model-dir /tmp/m-0.6b --no-peer --prompt $p --batches $bb --new 40 --warmup-new 2 \
    > "$OUT/ncu-att$p-b$bb.log" 2>&1
  echo "== ncu attention p$p b$bb rc $?"
  "$NCU" --import "$OUT/ncu-att$p-b$bb.ncu-rep" --csv --page details > "$OUT/ncu-att$p-b$bb.csv" 2>/dev/null
  python3 scripts/ncu_table.py "$OUT/ncu-att$p-b$bb.csv"
done
