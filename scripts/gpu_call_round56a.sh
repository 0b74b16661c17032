#!/usr/bin/env bash
# Round 56, call 1 (#21): the fused decode attention's three second builds, each alone and all
# three (--fused-warm-key: every block norms the new key; --fused-tc-only: the tensor-core
# kernels without the paths the engine never launches them for, ~40% of their machine code;
# --fused-early-rope: the RoPE factors and norm weights before the wait). The same bits:
# kernel_check --model-only (the fused cases with each build), then 0.6B and 1.7B batches 1, 2,
# 8 after 512-token prompts (the defaults' rows are the floors' rows when the card is an H200)
# and the 30B-A3B shape at 8 layers batch 1, three interleaved rounds.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round56a.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc kcm 150 --model-dir /tmp/m-0.6b --model-only
counted "$OUT/kcm.log" "decode_fused" "fused"
for b in "warm key" "tc only" "early rope" "all builds"; do
  counted "$OUT/kcm.log" "decode_fused $b" "$b"
done
V=("" "--fused-warm-key" "--fused-tc-only" "--fused-early-rope"
  "--fused-warm-key --fused-tc-only --fused-early-rope")
sweep s06 150 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" \
  "${V[@]}"
sweep s17 150 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" \
  "${V[@]}"
moe_model 8; echo "moe8 t=$((SECONDS - T0))"
sweep moe8 150 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128 --variant-rounds 3" \
  "${V[@]}"
echo "done t=$((SECONDS - T0))"
