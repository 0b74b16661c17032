#!/usr/bin/env bash
# On the GPU machine (#23): kernel_check --lora-only on the committed code, then Nsight
# Compute on the LoRA kernels of a 64-row 1.7B step (graph_check --profile 64, the first launch of
# each): speed of light, warp stall reasons and launch statistics, for the next round.
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
timeout 240 .gpu/kernel_check --model-dir /tmp/m-0.6b --lora-only > $OUT/kc-lora.log 2>&1; echo "kc rc $?"
grep -E "checks|FAILED|greedy" $OUT/kc-lora.log | cut -c1-140
NCU=${NCU:-/usr/local/cuda/bin/ncu}
timeout 200 $NCU --kernel-name regex:'lora_(expand_silu|expand_t1|shrink_t1|shrink_runs|add_rmsnorm)' --launch-count 13 \
  --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
  .gpu/graph_check --model-dir /tmp/m-1.7b --profile 64 > $OUT/ncu.log 2>&1; echo "ncu rc $?"
grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Stall|Grid Size|Registers Per|Waves Per SM" $OUT/ncu.log | head -90
