#!/usr/bin/env bash
# Round 53, call 5 (#29, #21): --fused-heads-ahead (the fused attention of GQA group 4 and up
# norming a warp's two heads together: the 30B-A3B shape's halves; the same bits) checked by
# kernel_check --model-only on the mixed MoE model (its fused cases against the unfused
# kernels bit for bit) and measured on the 30B-A3B shape whole (48 layers, batch 1, three
# interleaved rounds); on an H200 also the dense floors (0.6B b1/b8, 1.7B b1) on the defaults.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round53e.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
mix_model
kc kcha 90 --model-only --model-dir /tmp/m-mix --fused-heads-ahead
echo "fused checks: $(grep -ci "fused" "$OUT/kcha.log"), failed: $(grep -i "fused" "$OUT/kcha.log" | grep -c FAIL)"
timeout "$(cap 200)" .gpu/bench --config tests/fixtures/qwen3/config-30b-a3b.json \
  --write-model /dev/shm/m-moe48 > "$OUT/w48.log" 2>&1
echo "== write48 rc $? t=$((SECONDS - T0))"
sweep moe48 200 "--model-dir /dev/shm/m-moe48 --prompt 512 --batches 1 --new 128 --variant-rounds 3" "" "--fused-heads-ahead"
rm -rf /dev/shm/m-moe48
case "$gpu" in
  *H200*) model 0.6b; model 1.7b
    sweep d06 60 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128" ""
    sweep d17 40 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128" "" ;;
esac
echo "done t=$((SECONDS - T0))"
