#!/usr/bin/env bash
# On the GPU machine (#21): the per-warp fused norm (--warp-norm). kernel_check and graph_check
# with it on, the batch-1 op profile with it off and on, decode rows at batches 1, 2, 8.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b
timeout 200 .gpu/kernel_check --model-dir /tmp/m-0.6b --warp-norm > "$OUT/kernel_check.log" 2>&1
echo "kernel_check --warp-norm exit $?" | tee -a "$S"
grep -E "^kernel-check|FAIL" "$OUT/kernel_check.log" | head -20 | tee -a "$S"
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 500 --warp-norm > "$OUT/graph_check.log" 2>&1
echo "graph_check --warp-norm exit $?" | tee -a "$S"
grep -E "graph-check|FAIL" "$OUT/graph_check.log" | head -10 | tee -a "$S"
for sh in 0.6b 1.7b; do
  for v in "" "--warp-norm"; do
    timeout 60 .gpu/graph_check --model-dir /tmp/m-$sh --profile 1 $v 2>&1 | grep -E "fused\)|graph_pdl 1" | sed "s/^/$sh profile [${v:-default}] /" | tee -a "$S"
  done
  for v in "" "--warp-norm"; do
    timeout 60 .gpu/bench --no-peer --model-dir /tmp/m-$sh --batches 1,2,8 $v 2>&1 | grep -E "^ours decode" | sed "s/^/$sh [${v:-default}] /" | tee -a "$S"
  done
done
