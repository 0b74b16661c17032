#!/usr/bin/env bash
# Round 41, call 4: the o fold's second form (one stage a warp whatever fused_mma_one says,
# 1-row steps only, each block's partial pushed to the others 16 bytes a store after it is in
# its own slot): kernel_check --model-only with it (0.6B), graph_check with it, then batch 1
# after 512 tokens, default / --fused-o / --fused-mma-one 1 (the unfolded one-stage step),
# interleaved, and the batch-1 graph replay each way.
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
kc kc-fold 150 --model-only --model-dir /tmp/m-0.6b --fused-o
grep -E "o fold" "$OUT/kc-fold.log" | head -3
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --fused-o > "$OUT/gc.log" 2>&1
echo "== gc fused-o rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for r in 1 2 3; do
  for v in "" "--fused-o" "--fused-mma-one 1"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
  done
done
for v in "" "--fused-o" "--fused-mma-one 1"; do
  timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1 $v > "$OUT/prof.log" 2>&1
  echo "== profile 0.6b [$v] rc $? t=$((SECONDS - T0))"
  grep -E "graph replay" "$OUT/prof.log" | cut -c1-150
done
echo "done t=$((SECONDS - T0))"
