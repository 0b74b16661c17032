#!/usr/bin/env bash
# Round 57, the lean form of call 1 (scripts/gpu_call_round57a.sh) for a call with little device
# time left: the floors' rows first with the variants beside the defaults (1.7B batches 1, 2, 8
# with `--gemv-stream-fit` and `--gemv-stream-pipe`, three interleaved rounds; 0.6B batches 1,
# 2, 8 with `--gemv-stream-fit`, two), then kernel_check --gemv-only (the variants' bits), each
# step only while BUDGET lasts. Run as `export OUT BUDGET=...; bash scripts/gpu_call_round57b.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 1.7b; echo "model t=$((SECONDS - T0))"
sweep d17 170 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-stream-fit" "--gemv-stream-pipe"
left 200 && { model 0.6b; sweep d06 110 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 2" "" "--gemv-stream-fit"; }
left 280 && { kc gemv 120 --model-dir /tmp/m-1.7b --gemv-only; counted "$OUT/gemv.log" "whole rows" "fit"; counted "$OUT/gemv.log" "fit build loaded" "fit loaded"; }
echo "done t=$((SECONDS - T0))"
