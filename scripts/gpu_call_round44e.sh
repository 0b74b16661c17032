#!/usr/bin/env bash
# Round 44, call 5 (the qkv phase removed; gemv_tma on by default): kernel_check --gemv-only
# (tma_bits against the skinny matmuls, now with o's 2,048 inputs), batch 1 after 512-token
# prompts default / --gemv-tma-min-k 2048 (o on the streamed kernel too) on both shapes, two
# interleaved runs; then the whole kernel_check on the new defaults.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
tma_bits
for r in 1 2; do
  for v in "" "--gemv-tma-min-k 2048"; do
    row "0.6b p512 b1 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 $v
    row "1.7b p512 b1 [$v] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 $v
  done
done
left 300 && kc all 240 --model-dir /tmp/m-0.6b
echo "done t=$((SECONDS - T0))"
