#!/usr/bin/env bash
# On the GPU machine, call 1 of the next round (#21, #29), on round 36's final defaults
# (gemv_mma_plain at 6Mi elements, fused_lean on; rebuild .gpu/ first: the binaries packed at
# the end of round 36 are fe2d3c7's, where --fused-lean was still opt-in).
# 1. kernel_check --model-only (every fused case on the lean default and once more with the
#    division), --gemv-only; graph_check with the defaults (not yet run with fused_lean on).
# 2. The floors' rows (two runs), 8k rows, MoE 4 of 48 layers: the record of the defaults.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; moe_model 4; echo "models t=$((SECONDS - T0))"
kc kc 120 --model-dir /tmp/m-mix --model-only
kc kcg 100 --model-dir /tmp/m-0.6b --gemv-only
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 3000 > "$OUT/gc.log" 2>&1
echo "== gc rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -12
for r in 1 2; do
  for s in 0.6b 1.7b; do row "$s p512 run $r" --model-dir /tmp/m-$s --batches 1,2,8,16; done
done
for s in 0.6b 1.7b; do row "$s p8000" --model-dir /tmp/m-$s --prompt 8000 --batches 1,4,8 --new 64; done
row "0.6b p32000" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1,4 --new 32
row "moe4 p256" --model-dir /tmp/m-moe4 --prompt 256 --new 64 --batches 1,2,8
echo "done t=$((SECONDS - T0))"
