#!/usr/bin/env bash
# Round 62, call 7 (#21): the floors on the H200 with the round's defaults (the staged 3-8-row
# tensor-core input and the deferred norms' loads first, both on): 0.6B batches 1 / 2 / 8 with
# and without the staged input, 1.7B batches 1 / 8, three interleaved rounds; then 0.6B batch 1
# with the streamed 1-row matmul reserving 32 / 64 / 128 KiB more shared memory a block
# (`--gemv-tma-pad-kib`, fewer blocks of the launches around it on its SM; 775e60a's flag, measured
# slower on an H100 (call 11) and removed: run it on 775e60a's build).
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round62d.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
sweep f06 150 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--no-gemv-mma-x-stage"
sweep f17 90 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" ""
sweep pad 120 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 --variant-rounds 3" "" \
  "--gemv-tma-pad-kib 32" "--gemv-tma-pad-kib 64" "--gemv-tma-pad-kib 128"
echo "done t=$((SECONDS - T0))"
