#!/usr/bin/env bash
# On the GPU machine, call 1 of round 36 (#21): the fused decode attention's K/V ring
# (`--fused-ring N`, off by default; commit of this script), and round 35's questions.
# 1. kernel_check --model-only (the fused cases once more through rings of 2 and 3 stages, at
#    the register kernel's tolerances: bits where it is exact) and --fp8-only with the ring;
#    graph_check with the ring.
# 2. Decode, default against --fused-ring 2 / 3: 0.6B batches 1, 2, 8 after 512-token prompts
#    (the floors), batches 1, 4, 8 after 8k, batch 1, 4 after 32k; 1.7B 512 and 8k.
# 3. Batch 8 fresh against after a 1-row round: the engine's step profile (round 35 item 3).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
timeout 150 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
echo "== kc rc $? t=$((SECONDS - T0))"; grep -E "^kernel-check|FAIL|Error|panic" "$OUT/kc.log" | head -8
grep -c "ring. .* ok" "$OUT/kc.log"
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --fp8-only --fused-ring 2 > "$OUT/kc8.log" 2>&1
echo "== kc fp8 ring2 rc $? t=$((SECONDS - T0))"; grep -E "^kernel-check|FAIL|Error|panic" "$OUT/kc8.log" | head -8
grep -c "ring. .* ok" "$OUT/kc8.log"
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1500 --fused-ring 2 > "$OUT/gc.log" 2>&1
echo "== gc ring2 rc $? t=$((SECONDS - T0))"; grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -12
for v in "" "--fused-ring 2" "--fused-ring 3" "" "--fused-ring 2"; do
  row "0.6b p512 ${v:-default}" --model-dir /tmp/m-0.6b --batches 1,2,8 $v
done
for v in "" "--fused-ring 2" "--fused-ring 3"; do
  row "0.6b p8000 ${v:-default}" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,4,8 --new 64 $v
done
for v in "" "--fused-ring 2" "--fused-ring 3"; do
  row "0.6b p32000 ${v:-default}" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1,4 --new 32 $v
done
for v in "" "--fused-ring 2" "" "--fused-ring 2"; do
  row "1.7b p512 ${v:-default}" --model-dir /tmp/m-1.7b --batches 1,8 $v
done
for v in "" "--fused-ring 2"; do
  row "1.7b p8000 ${v:-default}" --model-dir /tmp/m-1.7b --prompt 8000 --batches 1,8 --new 64 $v
done
for bs in 8 1,8; do
  left 560 || break
  RUST_LOG=policy_serve=info timeout 60 .gpu/bench --no-peer --model-dir /tmp/m-0.6b --batches $bs \
    --new 256 --profile-steps 32 > "$OUT/p.log" 2>&1
  echo "== profile batches $bs rc $?: $(grep -E "^ours decode" "$OUT/p.log" | sed 's/ours decode batch //' | paste -sd' ')"
  grep "step profile" "$OUT/p.log" | grep "running=8" | tail -2 | sed "s/.*running=/running=/" | cut -c1-300
done
echo "done t=$((SECONDS - T0))"
