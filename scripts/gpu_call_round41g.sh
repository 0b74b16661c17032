#!/usr/bin/env bash
# Round 41, call 7 (aed46fe's binaries, the machine of call 6): call 6 read 0.6B batch 1 at
# 1,235 tok/s where calls 1-5 read 1,250-1,277 on the same defaults. Interleaved on this
# machine: default (two stages for 1-row steps) / --fused-mma-one 1 (one stage).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
for r in 1 2 3; do
  for v in "" "--fused-mma-one 1"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 $v
    row "1.7b p512 run $r [$v]" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 $v
  done
done
echo "done t=$((SECONDS - T0))"
