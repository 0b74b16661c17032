#!/usr/bin/env bash
# On the GPU machine, call 5 of round 36 (#21): `--fused-lean` as committed (the table index
# and offset by shift and mask alone; the scores-first loop of call 4 dropped): kernel_check
# --model-only with it, then decode against the default at 512 and 8k.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
timeout 100 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
echo "== kc rc $? t=$((SECONDS - T0))"; grep -E "^kernel-check|FAIL|Error|panic" "$OUT/kc.log" | head -8
echo "lean checks ok: $(grep -c "lean .* ok" "$OUT/kc.log")"
for v in "" "--fused-lean" "" "--fused-lean"; do
  row "0.6b p512 ${v:-default}" --model-dir /tmp/m-0.6b --batches 1,2,8 $v
done
for v in "" "--fused-lean"; do
  row "0.6b p8000 ${v:-default}" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,8 --new 64 $v
done
for v in "" "--fused-lean"; do
  row "1.7b p512 ${v:-default}" --model-dir /tmp/m-1.7b --batches 1,8 $v
done
echo "done t=$((SECONDS - T0))"
