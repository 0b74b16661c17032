#!/usr/bin/env bash
# Round 57, call 1 (#21, #29): the streamed gate|up as a loop of whole rows (`--gemv-stream-fit`,
# the gemv_ef_fit build) and with a one-row batch's halves refilled as summed
# (`--gemv-stream-pipe`, the gemv_ef_pipe build). kernel_check --gemv-only (their bits against the
# one-block-a-row-group kernels at 1-3 blocks an SM), then the floors' rows after 512-token
# prompts with the variants beside the defaults: 1.7B and 0.6B batches 1, 2, 8, three
# interleaved rounds; on an H200 then the 30B-A3B shape whole (48 layers) at batch 1, defaults
# only, if time is left. Run as `export OUT BUDGET=...; bash scripts/gpu_call_round57a.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 120 --model-dir /tmp/m-0.6b --gemv-only
counted "$OUT/gemv.log" "whole rows" "fit"
counted "$OUT/gemv.log" "fit build loaded" "fit loaded"
sweep d17 200 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-stream-fit" "--gemv-stream-pipe"
sweep d06 150 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-stream-fit"
case $gpu in *H200*) left 360 && moe48_sweep 150 "--prompt 512 --batches 1 --new 128 --variant-rounds 2" "" ;; esac
echo "done t=$((SECONDS - T0))"
