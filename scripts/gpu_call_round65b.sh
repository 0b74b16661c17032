#!/usr/bin/env bash
# Round 65, the floors' lean call (#21), for a session with little device time left: on an H200
# only (stops at once on any other card), the defaults alone, 0.6B then 1.7B at batches 1 / 8,
# three rounds each; then batches 64 / 256 / 512 of both shapes, one round, while time is left.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round65b.sh`.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
case $gpu in *H200*) ;; *) echo "stopped: not an H200"; exit 0 ;; esac
source scripts/gpu_lib.sh
model 0.6b; echo "model t=$((SECONDS - T0))"
sweep l06 80 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" ""
model 1.7b; echo "model t=$((SECONDS - T0))"
sweep l17 80 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" ""
sweep w06 60 "--model-dir /tmp/m-0.6b --prompt 512 --batches 64,256,512 --new 128 --variant-rounds 1" ""
sweep w17 60 "--model-dir /tmp/m-1.7b --prompt 512 --batches 64,256,512 --new 128 --variant-rounds 1" ""
echo "done t=$((SECONDS - T0))"
