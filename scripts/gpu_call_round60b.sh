#!/usr/bin/env bash
# Round 60, call 2 (#21): kernel_check --gemv-only on the mended stage check (the review of round
# 59 held the scale-first staged runs to kernels with the default deferred norm: 48 failed at 96
# and 1,024 inputs in call 1) with the late stage removed. On an H200 first the floors' rows
# (1.7B and 0.6B batches 1, 2, 8 after 512-token prompts, defaults, three rounds). Then, on any
# card, existing knobs swept again on today's defaults: 1.7B batch 1 (the 1-row graph's
# partitions, the attention's one-stage loop, the gate|up at one block an SM, the L2 prefetch,
# the deferred norm at 2,048 inputs) and 0.6B batch 8 (16 partitions, the unfused tensor-core
# attention past 512 tokens at 5+ rows, with 3 stages). The 30B-A3B shape on an H200 if time is
# left.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round60b.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "stage" "stage"
case $gpu in *H200*)
  sweep d17 100 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
  sweep d06 80 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" ;;
esac
sweep k17 120 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 --variant-rounds 3" "" \
  "--graph-splits-one 32" "--graph-splits-one 128" "--fused-mma-one 1" "--gemv-stream 1" \
  "--l2-prefetch" "--norm-deferred-max-k 2048"
sweep k06 100 "--model-dir /tmp/m-0.6b --prompt 512 --batches 8 --new 128 --variant-rounds 3" "" \
  "--graph-splits-mid 16" "--fused-long-ctx-many 512" "--fused-long-ctx-many 512 --mma-decode-stages 3"
case $gpu in *H200*) left 330 && moe48_sweep 150 "--prompt 512 --batches 1 --new 128 --variant-rounds 2" "" ;; esac
echo "done t=$((SECONDS - T0))"
