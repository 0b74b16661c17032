#!/usr/bin/env bash
# Round 42, call 6 (the carveout of 1-2-row kernels on by default): kernel_check --model-only
# and graph_check on the defaults, then the kernels of 3-8-row steps and the fused attention's
# CUDA-core kernels at one carveout of their own (--smem-carveout-many PCT, off by default):
# the batch-8 graph replay and batches 1 and 8 interleaved on both shapes, after 512 and 8k.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
kc kc-model 150 --model-only --model-dir /tmp/m-mix
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 > "$OUT/gc.log" 2>&1
echo "== gc rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
V=("" "--smem-carveout-many 58" "--smem-carveout-many 75" "--smem-carveout-many 100")
for v in "${V[@]}"; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 8 $v > "$OUT/prof.log" 2>&1
  echo "== profile 0.6b [$v] rc $?: $(grep -E "graph_pdl 1: graph replay" "$OUT/prof.log" | cut -c1-75 | paste -sd' ')"
done
for r in 1 2; do
  for v in "${V[@]}"; do
    row "0.6b p512 b1,8 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128 $v
  done
done
for v in "${V[@]}"; do
  row "1.7b p512 b1,8 [$v]" --model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128 $v
done
for v in "${V[@]}"; do
  row "0.6b p4k b1,8 [$v]" --model-dir /tmp/m-0.6b --prompt 4000 --batches 1,8 --new 64 $v
done
echo "done t=$((SECONDS - T0))"
