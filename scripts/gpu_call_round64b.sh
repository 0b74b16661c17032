#!/usr/bin/env bash
# Round 64, call 2 (#21): the floors on the H200 with the defaults (round 69: the lm_head of
# 1-row steps on cuBLAS): 0.6B batches 1 / 8 and 1.7B batches 1 / 8, three interleaved rounds
# each beside --gemv-tma-head 8 (the streamed head and one-launch greedy head, round 64-68's
# default; until round 69 this ran --no-gemv-tma-head beside); then batches 64 / 256 / 512 of both
# shapes, one round. Stops at once on any card but an H200. The 1.7B model is written only
# after the 0.6B rows are in (round 68), so a call with ~250 s of device time left still
# measures 0.6B's floors. With `lean` (for a session with little device time left) the
# defaults alone.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round64b.sh [lean]`.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
case $gpu in *H200*) ;; *) echo "stopped: not an H200"; exit 0 ;; esac
source scripts/gpu_lib.sh
V=("--gemv-tma-head 8"); [ "${1:-}" = lean ] && V=()
model 0.6b; echo "model 0.6b t=$((SECONDS - T0))"
sweep f06 130 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" "" "${V[@]}"
left && { model 1.7b; echo "model 1.7b t=$((SECONDS - T0))"; }
sweep f17 90 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" "" "${V[@]}"
sweep w06 60 "--model-dir /tmp/m-0.6b --prompt 512 --batches 64,256,512 --new 128 --variant-rounds 1" ""
sweep w17 60 "--model-dir /tmp/m-1.7b --prompt 512 --batches 64,256,512 --new 128 --variant-rounds 1" ""
echo "done t=$((SECONDS - T0))"
