#!/usr/bin/env bash
# Round 44, call 10: the streamed 1-row matmul on 1,024-row weights only (the MoE router back
# on the skinny matmuls): kernel_check --gemv-only (tma_bits on any row count), 0.6B batch 1
# and the 4-layer 30B-A3B shape's batch 1 after 512-token prompts on the defaults.
set -u
source scripts/gpu_lib.sh
model 0.6b; moe_model 4; echo "models t=$((SECONDS - T0))"
tma_bits
row "0.6b p512 b1 []" --model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128
row "moe4 p512 b1 []" --model-dir /tmp/m-moe4 --prompt 512 --batches 1 --new 128
echo "done t=$((SECONDS - T0))"
