#!/usr/bin/env bash
# Round 54, call 1 (#29, #21): --fused-block-weights (the fused attention's merge of a block's
# states with its weights formed once, by one warp: the same bits) checked by kernel_check
# --model-only on the mixed MoE model and on 0.6B (the fused cases against the unfused kernels
# bit for bit) and measured beside the defaults: the 30B-A3B shape whole (48 layers, batch 1,
# three interleaved rounds), 8 layers at batches 1 and 8, 0.6B at batches 1 and 8. On an H200
# also 1.7B batch 1 (the floors: say which card gave each row).
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round54a.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
mix_model; model 0.6b; moe_model 8; echo "models t=$((SECONDS - T0))"
kc kcbw 90 --model-only --model-dir /tmp/m-mix --fused-block-weights
echo "fused checks: $(grep -ci "fused" "$OUT/kcbw.log"), failed: $(grep -i "fused" "$OUT/kcbw.log" | grep -c FAIL)"
sweep d06 70 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128" "" "--fused-block-weights"
sweep moe8 70 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1,8 --new 128" "" "--fused-block-weights"
left 260 && moe48_sweep 200 "--prompt 512 --batches 1 --new 128 --variant-rounds 3" "" "--fused-block-weights"
case "$gpu" in
  *H200*) model 1.7b; sweep d17 40 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128" "" ;;
esac
echo "done t=$((SECONDS - T0))"
