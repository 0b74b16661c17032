#!/usr/bin/env bash
# On the GPU machine (#21): the skinny-matmul variants. kernel_check with them on (every
# kernel, the gemv checks of 1-8 rows, the model-level checks), graph_check with them on
# (graph vs eager, 500-step stress), then decode tok/s at batches 1 and 8 for 0.6B and 1.7B:
# default, --gemv-mma, --l2-prefetch, both.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b
V="--gemv-mma --l2-prefetch"
timeout 200 .gpu/kernel_check --model-dir /tmp/m-0.6b $V > "$OUT/kernel_check.log" 2>&1
echo "kernel_check exit $?" | tee -a "$S"
grep -E "^kernel-check|FAIL" "$OUT/kernel_check.log" | head -20 | tee -a "$S"
grep -E "^gemv|^norm_gemv" "$OUT/kernel_check.log" | sort -k5 -g -r | head -3 | tee -a "$S"
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 500 $V > "$OUT/graph_check.log" 2>&1
echo "graph_check exit $?" | tee -a "$S"
grep -E "graph-check|FAIL|mismatch|buckets" "$OUT/graph_check.log" | head -10 | tee -a "$S"
for shape in 0.6b 1.7b; do
  for v in "" "--gemv-mma" "--l2-prefetch" "$V"; do
    timeout 60 .gpu/bench --no-peer --model-dir /tmp/m-$shape --batches 1,8 $v > "$OUT/bench-$shape.log" 2>&1
    grep -E "^ours decode" "$OUT/bench-$shape.log" | sed "s/^/$shape [${v:-default}] /" | tee -a "$S"
  done
done
