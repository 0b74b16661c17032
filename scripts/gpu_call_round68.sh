#!/usr/bin/env bash
# Round 68 (#21): the last floors, 0.6B batches 1 / 8 on the H200 with the defaults, first and
# alone (three interleaved rounds); then, while BUDGET lasts, 1.7B batches 1 / 8 and the wide
# 0.6B batches. For a session with little device time left: stops at once on any card but an
# H200 and writes the 1.7B model only after the 0.6B rows are in.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round68.sh`.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
case $gpu in *H200*) ;; *) echo "stopped: not an H200"; exit 0 ;; esac
source scripts/gpu_lib.sh
model 0.6b; echo "model 0.6b t=$((SECONDS - T0))"
sweep f06 130 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" ""
left 200 && { model 1.7b; echo "model 1.7b t=$((SECONDS - T0))"; }
[ -d /tmp/m-1.7b ] && sweep f17 90 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128 --variant-rounds 2" ""
sweep w06 60 "--model-dir /tmp/m-0.6b --prompt 512 --batches 64,256,512 --new 128 --variant-rounds 1" ""
echo "done t=$((SECONDS - T0))"
