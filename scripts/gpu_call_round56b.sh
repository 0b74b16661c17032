#!/usr/bin/env bash
# Round 56, call 2 (#21, #29): the three second builds of the fused decode attention beside the
# defaults on the 30B-A3B shape at 8 layers (GQA group 8, run as two group-4 halves; --fused-qkv
# does not serve it), batch 1 after 512-token prompts, three interleaved rounds; then the
# 1.7B batch-1 rows with --fused-qkv over 2k-token prompts (contexts still within one cluster).
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round56b.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
moe_model 8; model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
sweep moe8 150 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128 --variant-rounds 3" \
  "" "--fused-warm-key" "--fused-tc-only" "--fused-early-rope" \
  "--fused-warm-key --fused-tc-only --fused-early-rope"
sweep q06 120 "--model-dir /tmp/m-0.6b --prompt 1800 --batches 1 --new 128 --variant-rounds 3" \
  "" "--fused-qkv"
sweep q17 120 "--model-dir /tmp/m-1.7b --prompt 1800 --batches 1 --new 128 --variant-rounds 3" \
  "" "--fused-qkv"
echo "done t=$((SECONDS - T0))"
