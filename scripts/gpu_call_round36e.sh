#!/usr/bin/env bash
# On the GPU machine, call 5 of round 36 (#21): `--fused-lean` as committed (the table index
# and offset by shift and mask alone; the scores-first loop of call 4 dropped): kernel_check
# --model-only with it, then decode against the default at 512 and 8k.
# (`--fused-lean` is the flag of the binaries it ran; since a4f4863 the shift and mask is the
# default and `--no-fused-lean` turns it off.)
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
kc kc 100 --model-dir /tmp/m-mix --model-only
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
