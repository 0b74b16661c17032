#!/usr/bin/env bash
# Round 42, call 5: the shared-memory carveout for the kernels of 1-2-row steps only (the
# skinny matmuls of gemv.cu, the fused attention's tensor-core kernels; --smem-carveout PCT,
# off by default): graph_check with it, the batch-1/8 graph replay, then batches 1, 2 and 8
# interleaved on both shapes, and batch 1 after 2k and 8k tokens.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 --smem-carveout 100 > "$OUT/gc.log" 2>&1
echo "== gc rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
V=("" "--smem-carveout 100" "--smem-carveout 75")
for m in 0.6b 1.7b; do
  for v in "${V[@]}"; do
    timeout 60 .gpu/graph_check --model-dir /tmp/m-$m --profile 1,8 $v > "$OUT/prof.log" 2>&1
    echo "== profile $m [$v] rc $?: $(grep -E "graph_pdl 1: graph replay" "$OUT/prof.log" | cut -c1-75 | paste -sd' ')"
  done
done
for r in 1 2; do
  for v in "${V[@]}"; do
    row "0.6b p512 b1,2,8 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 $v
  done
  for v in "${V[@]}"; do
    row "1.7b p512 b1,2,8 [$v] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 $v
  done
done
for v in "${V[@]}"; do
  row "0.6b p2k b1,2 [$v]" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1,2 --new 128 $v
  row "0.6b p8k b1,2 [$v]" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,2 --new 64 $v
done
echo "done t=$((SECONDS - T0))"
