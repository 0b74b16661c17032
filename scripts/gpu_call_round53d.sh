#!/usr/bin/env bash
# Round 53, call 4 (#21, #29): the floors on the H200 only (on any other card it stops at once):
# 0.6B batches 1 and 8, 1.7B batch 1 after 512-token prompts and the 30B-A3B shape whole (48
# layers) at batch 1, with 214491c's binaries: `--fused-merge-weights` is d738d98's default
# (the same machine code), "" the defaults before it.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round53d.sh`.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$gpu"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
sweep d06 80 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128" "--fused-merge-weights" ""
sweep d17 60 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128" "--fused-merge-weights" ""
if left 250; then
  timeout "$(cap 200)" .gpu/bench --config tests/fixtures/qwen3/config-30b-a3b.json \
    --write-model /dev/shm/m-moe48 > "$OUT/w48.log" 2>&1
  echo "== write48 rc $? t=$((SECONDS - T0))"
  sweep moe48 150 "--model-dir /dev/shm/m-moe48 --prompt 512 --batches 1 --new 128" "--fused-merge-weights" ""
  rm -rf /dev/shm/m-moe48
fi
echo "done t=$((SECONDS - T0))"
