#!/usr/bin/env bash
# On the GPU machine, call 4 of round 36 (#21): the lean fused decode attention
# (`--fused-lean`, off by default: a power-of-two block size's table index by shift and mask,
# each round's scores before its softmax steps; the same bits).
# 1. kernel_check --model-only (every fused case once more on the lean kernels, at the default
#    kernel's tolerances: bits where it is exact); graph_check with it.
# 2. Decode, default against --fused-lean: 0.6B after 512 (batches 1, 2, 8, 16), 8k, 32k;
#    1.7B after 512 and 8k.
# (`--fused-lean` is the flag of the binaries it ran; since a4f4863 the shift and mask is the
# default and `--no-fused-lean` turns it off.)
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
kc kc 100 --model-dir /tmp/m-mix --model-only
echo "lean checks ok: $(grep -c "lean .* ok" "$OUT/kc.log")"
timeout 80 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 500 --fused-lean > "$OUT/gc.log" 2>&1
echo "== gc lean rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -12
T0=$((T0 - 260))   # row's guard: stop starting rows 280 s into the call
for r in 1 2; do
  for v in "" "--fused-lean"; do
    row "0.6b p512 ${v:-default} run $r" --model-dir /tmp/m-0.6b --batches 1,2,8,16 $v
  done
done
for v in "" "--fused-lean"; do
  row "0.6b p8000 ${v:-default}" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,4,8 --new 64 $v
done
for v in "" "--fused-lean"; do
  row "1.7b p512 ${v:-default}" --model-dir /tmp/m-1.7b --batches 1,8 $v
done
for v in "" "--fused-lean"; do
  row "0.6b p32000 ${v:-default}" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1,4 --new 32 $v
done
for v in "" "--fused-lean"; do
  row "1.7b p8000 ${v:-default}" --model-dir /tmp/m-1.7b --prompt 8000 --batches 1,8 --new 64 $v
done
echo "done"
