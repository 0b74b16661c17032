#!/usr/bin/env bash
# On the GPU machine, round 39's call 5 (#21): the review's build (the attention's choice moved,
# gemv_mma.fatbin loaded once for both kernel sets, the presummed entries through one macro):
# kernel_check --gemv-only and graph_check on the defaults; the 32k-token batch-4 rows that
# calls 1 and 4 measured apart (684 / 1,029 tok/s), now on one binary: the defaults, every step
# unfused, every step fused.
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
kc kc-gemv 150 --model-dir /tmp/m-0.6b --gemv-only
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1000 > "$OUT/gc.log" 2>&1
echo "== gc defaults rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for v in "" "--fused-long-ctx 0" "--no-fused-long-ctx"; do
  row "0.6b p32000 [$v]" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1,4 --new 32 $v
done
echo "done t=$((SECONDS - T0))"
