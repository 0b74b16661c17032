#!/usr/bin/env bash
# On the GPU machine, round 27, call 2 (#23; it ran commit 20121e2: --lora-qkv-rope is gone since,
# measured slower, and the side-stream bound's default is now 64): kernel_check --lora-only with --lora-qkv-rope (the
# qkv delta inside the q/k norm + RoPE + KV write, held bit for bit to the serial path, graphs vs
# eager); decode with every row on one of 8 rank-16 adapters, the defaults against
# --lora-qkv-rope and --lora-side-min-rows 16, both shapes, two runs each; Nsight Compute (real
# clocks) on the 64-row 1.7B gate|up expand+SiLU and qkv expand.
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
timeout 240 .gpu/kernel_check --model-dir /tmp/m-0.6b --lora-only --lora-qkv-rope > $OUT/kc-rope.log 2>&1
echo "kc rope rc $?"; grep -E "checks|FAILED|greedy" $OUT/kc-rope.log | cut -c1-140
timeout 200 .gpu/kernel_check --model-dir /tmp/m-0.6b --model-only > $OUT/kc-model.log 2>&1
echo "kc model rc $?"; grep -E "checks|FAILED" $OUT/kc-model.log | cut -c1-140
PART=none SHAPES="0.6b 1.7b" \
  VARIANTS="${VARIANTS:-;--lora-qkv-rope;--lora-side-min-rows 16;;--lora-qkv-rope;--lora-side-min-rows 16}" \
  bash scripts/gpu_call_round26.sh
NCU=${NCU:-/usr/local/cuda/bin/ncu}
for k in lora_expand_silu lora_expand_t1; do
  timeout 90 $NCU --clock-control none --kernel-name regex:$k --launch-skip 300 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats .gpu/bench --config tests/fixtures/qwen3/config-1.7b.json --batches 64 --new 32 \
    --prompt 64 --no-peer --adapters 8 --adapter-rank 16 > $OUT/ncu-$k.log 2>&1; echo "ncu $k rc $?"
  grep -E "^  [a-z_0-9]+.*\(|Duration|Throughput|Hit Rate|Warp Cycles|Occupancy|Grid Size|Registers Per|Waves|stalled" $OUT/ncu-$k.log | head -30
done
