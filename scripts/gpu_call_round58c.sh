#!/usr/bin/env bash
# Round 58, call 4+ (#21): the floors on an H200 only. On any other card it stops at once (the
# tool may lend an H100 for kind nvidia-h200; the floors are the H200's). On an H200: 1.7B and
# 0.6B batches 1, 2, 8 after 512-token prompts on the defaults, three rounds, then the 30B-A3B
# shape whole (48 layers) at batch 1 if time is left.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round58c.sh`.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
case $gpu in *H200*) ;; *) echo "not an H200: stopped"; exit 0 ;; esac
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
sweep d17 100 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
sweep d06 80 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
left 120 && moe48_sweep 150 "--prompt 512 --batches 1 --new 128 --variant-rounds 2" ""
echo "done t=$((SECONDS - T0))"
