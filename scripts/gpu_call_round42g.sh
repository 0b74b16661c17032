#!/usr/bin/env bash
# Round 42, call 7 (539e1b6's binaries; main's defaults): the carveout of 1-2-row kernels on
# (default) and off (--no-smem-carveout) at batch 1 after 4k-token prompts, where the 1-row
# step's attention runs on the fused CUDA-core kernels (past one cluster) at the driver's
# carveout beside its matmuls' 100%.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
for r in 1 2; do
  for v in "" "--no-smem-carveout"; do
    row "0.6b p4k b1,2 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 4000 --batches 1,2 --new 64 $v
  done
done
for v in "" "--no-smem-carveout"; do
  row "1.7b p4k b1 [$v]" --model-dir /tmp/m-1.7b --prompt 4000 --batches 1 --new 64 $v
done
echo "done t=$((SECONDS - T0))"
