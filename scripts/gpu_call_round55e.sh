#!/usr/bin/env bash
# Round 55, call 7 (#21): --fused-warm-key (the 1-2-row kernels norm the new key in every block,
# so the block holding the new token, the last to push, finds that code cached). The same bits:
# kernel_check --model-only (the fused cases with its 1- and 2-stage kernels), then 0.6B and
# 1.7B batches 1, 2, 8 and the 30B-A3B shape at 8 layers batch 1 after 512-token prompts, three
# interleaved rounds.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round55e.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc kcm 150 --model-dir /tmp/m-0.6b --model-only
counted "$OUT/kcm.log" "decode_fused warm key" "warm key"
sweep s06 150 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" \
  "--fused-warm-key"
sweep s17 150 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" \
  "--fused-warm-key"
moe_model 8; echo "moe8 t=$((SECONDS - T0))"
sweep moe8 150 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128 --variant-rounds 3" "" \
  "--fused-warm-key"
echo "done t=$((SECONDS - T0))"
