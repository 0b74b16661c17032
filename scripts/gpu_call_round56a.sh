#!/usr/bin/env bash
# Round 56, call 5 (#21): the fused decode attention's second builds, each alone and all three
# (--fused-warm-key: every block norms the new key; --fused-tc-only: the tensor-core kernels
# without the paths the engine never launches them for, ~40% of their machine code;
# --fused-early-rope: the RoPE factors and norm weights before the wait), and --fused-qkv (a
# 1-row step's add + RMSNorm + qkv matmul inside the fused attention: four launches a layer).
# The same bits: kernel_check --model-only (the fused cases with each build, the qkv kernel
# against the two launches it replaces, the engine's greedy tokens with --fused-qkv), then
# 0.6B and 1.7B batches 1, 2, 8 after 512-token prompts, three interleaved rounds (the
# defaults' rows are the floors' rows when the card is an H200).
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round56a.sh` on commit 6dc934e's build
# (it ran so, call 5; its flags were removed after it: BENCHMARKS.md, round 56).
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc kcm 200 --model-dir /tmp/m-0.6b --model-only
counted "$OUT/kcm.log" "decode_fused" "fused"
for b in "warm key" "tc only" "early rope" "all builds" "decode_fused_qkv" "fused qkv engine"; do
  counted "$OUT/kcm.log" "$b" "$b"
done
grep -E "fused qkv.*not checked" "$OUT/kcm.log"
V=("" "--fused-warm-key" "--fused-tc-only" "--fused-early-rope"
  "--fused-warm-key --fused-tc-only --fused-early-rope" "--fused-qkv")
sweep s06 150 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" \
  "${V[@]}"
sweep s17 150 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" \
  "${V[@]}"
# What time is left: --fused-qkv after 1,800-token prompts (still one cluster), then the builds
# on the 30B-A3B shape at 8 layers (scripts/gpu_call_round56b.sh runs both whole).
sweep q17 100 "--model-dir /tmp/m-1.7b --prompt 1800 --batches 1 --new 128 --variant-rounds 2" \
  "" "--fused-qkv"
if left 420; then
  moe_model 8
  sweep moe8 100 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128 --variant-rounds 2" \
    "${V[@]:0:5}"
fi
echo "done t=$((SECONDS - T0))"
