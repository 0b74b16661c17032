#!/usr/bin/env bash
# On the GPU machine, round 40's call 8 (#21; commit 614656d's binaries, whose dense path is
# main's): the fused tensor-core attention's two-stage form for 1-row steps only
# (--fused-mma 2 --fused-mma-rows 1) against the default (one stage, 1-2 rows) at batch 1,
# interleaved runs: round 38 measured it once each way (+1.2% after 512, +4% after 2k on 0.6B).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
for r in 1 2 3; do
  for v in "" "--fused-mma 2 --fused-mma-rows 1"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 $v
    row "0.6b p2048 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 2048 --batches 1 --new 128 $v
  done
done
for r in 1 2; do
  for v in "" "--fused-mma 2 --fused-mma-rows 1"; do
    left 170 && row "1.7b p512 run $r [$v]" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 $v
  done
done
echo "done t=$((SECONDS - T0))"
