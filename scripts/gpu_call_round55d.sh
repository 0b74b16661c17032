#!/usr/bin/env bash
# Round 55, call 6 (#21, #29): the defaults of 0c8e8df (the push by st.async with the merge's
# weights inlined, the 1-2-row kernels' peers running block 0's merge code dry). kernel_check
# --model-only (the fused cases bit for bit), then the floors' rows after 512-token prompts:
# 0.6B and 1.7B batches 1, 2, 8; on an H200 also the 30B-A3B shape whole (48 layers) at batch 1.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round55d.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc kcm 150 --model-dir /tmp/m-0.6b --model-only
counted "$OUT/kcm.log" "decode_fused" "fused"
sweep d06 100 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
sweep d17 100 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
case $gpu in *H200*) moe48_sweep 150 "--prompt 512 --batches 1 --new 128 --variant-rounds 3" "" ;; esac
echo "done t=$((SECONDS - T0))"
