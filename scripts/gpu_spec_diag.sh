#!/usr/bin/env bash
# On the GPU machine (#24): where a verify step's extra cost comes from. graph_check
# --verify-only with the fused decode off (eager reference unfused too), and plain decode
# rows at batch 1-5 and 8/16/40 with the fused decode on and off, next to the verify sweep at K 4.
set -u
source scripts/gpu_lib.sh
model 0.6b
echo "== graph_check --verify-only --no-fused-decode" | tee -a "$S"
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --verify-only --no-fused-decode 2>&1 | grep -E "^\||graph-check" | tee -a "$S"
echo "== graph_check --verify-only --no-clusters" | tee -a "$S"
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --verify-only --no-clusters 2>&1 | grep -E "^\||graph-check" | tee -a "$S"
for f in "" "--no-fused-decode"; do
  echo "== plain rows $f" | tee -a "$S"
  timeout 120 .gpu/bench --model-dir /tmp/m-0.6b --no-peer --batches 1,2,5,8,16,40 --prompt 512 --new 128 $f 2>&1 | grep -E "^ours decode" | tee -a "$S"
  echo "== spec K=4 $f" | tee -a "$S"
  timeout 120 .gpu/bench --model-dir /tmp/m-0.6b --no-peer --batches 1,2 --prompt 512 --new 128 --spec-ks 4 --spec-corrupt 1,0 $f 2>&1 | grep -E "^\|" | tee -a "$S"
done
