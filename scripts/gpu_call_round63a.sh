#!/usr/bin/env bash
# Round 63, call 1 (#21): the floors on the H200 with round 62's defaults (the staged 3-8-row
# tensor-core input and the deferred norms' loads first, both on): 0.6B batches 1 / 2 / 8 with
# and without the staged input, 1.7B batches 1 / 8, three interleaved rounds; then batches
# 64 / 256 / 512 of both shapes, one round. Stops at once on any card but an H200.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round63a.sh`.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
case $gpu in *H200*) ;; *) echo "stopped: not an H200"; exit 0 ;; esac
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
sweep f06 170 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--no-gemv-mma-x-stage"
sweep f17 100 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" ""
sweep w06 60 "--model-dir /tmp/m-0.6b --prompt 512 --batches 64,256,512 --new 128 --variant-rounds 1" ""
sweep w17 60 "--model-dir /tmp/m-1.7b --prompt 512 --batches 64,256,512 --new 128 --variant-rounds 1" ""
echo "done t=$((SECONDS - T0))"
