#!/usr/bin/env bash
# Round 41, call 8: three batches of weight loads in flight in the 1-2-row plain matmuls over
# more than 4,096 inputs (--gemv-triple-buffer: 1.7B's down, 6,144 wide, all of a row's loads
# issued before the wait). kernel_check --gemv-only with it (its kernels bit for bit against
# the one-batch ones; the 1.7B model's checks), graph_check on 1.7B with it, then 1.7B batches
# 1, 2 and 8 after 512 tokens and batch 1 after 2k, default / with it, interleaved; the 1.7B
# batch-1 op table both ways (down alone).
set -u
source scripts/gpu_lib.sh
model 1.7b; echo "models t=$((SECONDS - T0))"
kc kc-tb 150 --gemv-only --model-dir /tmp/m-1.7b --gemv-triple-buffer
grep -E "three batches" "$OUT/kc-tb.log" | head -3
timeout 120 .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 --gemv-triple-buffer > "$OUT/gc.log" 2>&1
echo "== gc tb rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for r in 1 2 3; do
  for v in "" "--gemv-triple-buffer"; do
    row "1.7b p512 run $r [$v]" --model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 $v
    row "1.7b p2048 run $r [$v]" --model-dir /tmp/m-1.7b --prompt 2048 --batches 1 --new 128 $v
  done
done
for v in "" "--gemv-triple-buffer"; do
  timeout 100 .gpu/graph_check --model-dir /tmp/m-1.7b --profile 1 $v > "$OUT/prof.log" 2>&1
  echo "== profile 1.7b [$v] rc $? t=$((SECONDS - T0))"
  grep -E "down|graph replay|sum of ops" "$OUT/prof.log" | cut -c1-150
done
echo "done t=$((SECONDS - T0))"
