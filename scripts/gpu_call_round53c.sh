#!/usr/bin/env bash
# Round 53, call 3 (#29, #21): --fused-merge-weights against the defaults in three interleaved
# rounds on the 30B-A3B shape whole (48 layers, batch 1; +0.4-0.7% at 8 layers in call 1) and
# on 0.6B batch 1 (flat in call 1).
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round53c.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
model 0.6b
sweep d06 60 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 --variant-rounds 3" "" "--fused-merge-weights"
timeout "$(cap 200)" .gpu/bench --config tests/fixtures/qwen3/config-30b-a3b.json \
  --write-model /dev/shm/m-moe48 > "$OUT/w48.log" 2>&1
echo "== write48 rc $? t=$((SECONDS - T0))"
sweep moe48 200 "--model-dir /dev/shm/m-moe48 --prompt 512 --batches 1 --new 128 --variant-rounds 3" "" "--fused-merge-weights"
rm -rf /dev/shm/m-moe48
echo "done t=$((SECONDS - T0))"
