#!/usr/bin/env bash
# On the GPU machine, round 27. Call 1 (it ran commit 9d93ba6, where the norm's preload was off
# by default and asked for with --lora-norm-preload; now on, --no-lora-norm-preload turns it off):
# kernel_check --lora-only (the lockstep graphs-vs-eager check of the run shrink) with the
# defaults and with --no-lora-norm-preload, Nsight Compute on the
# 64-row 1.7B LoRA kernels (scripts/gpu_ncu_lora.sh, #23); decode with every row on one of 8
# rank-16 adapters, defaults against --no-lora-norm-preload, both shapes (two runs each,
# alternating); then Nsight Compute on the batch-1 1.7B matmuls and the batch-8 0.6B fused
# decode attention (#21). PARTS picks (default "checks bench ncu").
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
P=${PARTS:-checks bench ncu}
if [[ $P == *checks* ]]; then
  bash scripts/gpu_ncu_lora.sh
  timeout 240 .gpu/kernel_check --model-dir /tmp/m-0.6b --lora-only --no-lora-norm-preload > $OUT/kc-pre.log 2>&1
  echo "kc preload rc $?"; grep -E "checks|FAILED|greedy" $OUT/kc-pre.log | cut -c1-140
fi
if [[ $P == *bench* ]]; then
  PART=none SHAPES="0.6b 1.7b" VARIANTS="${VARIANTS:-;--no-lora-norm-preload;;--no-lora-norm-preload}" \
    bash scripts/gpu_call_round26.sh
fi
if [[ $P == *ncu* ]]; then
  NCU=${NCU:-/usr/local/cuda/bin/ncu}
  SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy"
  pick='^  [a-z_0-9]+.*\(|Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Stall|Grid Size|Registers Per|Waves Per SM|Block Limit'
  timeout 120 $NCU --kernel-name regex:'gemv' --launch-count 8 $SEC \
    .gpu/graph_check --model-dir /tmp/m-1.7b --profile 1 > $OUT/ncu-b1.log 2>&1; echo "ncu b1 rc $?"
  grep -E "$pick" $OUT/ncu-b1.log | head -100
  timeout 90 $NCU --kernel-name regex:'decode_fused' --launch-count 2 $SEC \
    .gpu/graph_check --model-dir /tmp/m-0.6b --profile 8 > $OUT/ncu-attn8.log 2>&1; echo "ncu attn rc $?"
  grep -E "$pick" $OUT/ncu-attn8.log | head -40
fi
