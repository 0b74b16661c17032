#!/usr/bin/env bash
# On the GPU machine, call 1 of round 36 (#21): two variants, off by default.
#  * the fused decode attention's K/V through a shared-memory ring (`--fused-ring N`);
#  * tensor-core skinny matmuls without their fused norm for 3-8 rows (`--gemv-mma-plain K`).
# 1. kernel_check --model-only (every fused case once more through rings of 2 and 3 stages,
#    at the register kernel's tolerances: bits where it is exact), --gemv-only (with the
#    dispatch of --gemv-mma-plain against the paths it takes, bit for bit); graph_check with
#    both on.
# 2. Decode, default against each: 0.6B batches 1, 2, 8 after 512-token prompts (the floors),
#    1, 4, 8 after 8k, 1, 4 after 32k; 1.7B 512 and 8k.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
kc kc 150 --model-dir /tmp/m-mix --model-only
echo "ring checks ok: $(grep -c "ring. .* ok" "$OUT/kc.log")"
kc kcg 150 --model-dir /tmp/m-0.6b --gemv-only
grep "gemv_mma_plain" "$OUT/kcg.log" | head -30
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1500 --fused-ring 2 \
  --gemv-mma-plain 4096 > "$OUT/gc.log" 2>&1
echo "== gc ring2 + mma-plain rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -12
for v in "" "--fused-ring 2" "--gemv-mma-plain 4096" "--fused-ring 2 --gemv-mma-plain 4096"; do
  row "0.6b p512 ${v:-default}" --model-dir /tmp/m-0.6b --batches 1,2,8 $v
done
for v in "" "--fused-ring 2" "--fused-ring 3"; do
  row "0.6b p8000 ${v:-default}" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,4,8 --new 64 $v
done
for v in "" "--fused-ring 2"; do
  row "0.6b p32000 ${v:-default}" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1,4 --new 32 $v
done
for v in "" "--fused-ring 2" "--gemv-mma-plain 2048" "--gemv-mma-plain 8192"; do
  row "1.7b p512 ${v:-default}" --model-dir /tmp/m-1.7b --batches 1,8 $v
done
for v in "" "--fused-ring 2"; do
  row "1.7b p8000 ${v:-default}" --model-dir /tmp/m-1.7b --prompt 8000 --batches 1,8 --new 64 $v
done
echo "done t=$((SECONDS - T0))"
