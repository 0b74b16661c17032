#!/usr/bin/env bash
# Round 53, call 2 (#29): the 30B-A3B shape whole (48 layers) at batch 1 after 512-token prompts
# on the defaults, with --no-graph-feed beside them, if /dev/shm holds the model (~61 GB).
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round53b.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
shm=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
if [ "${shm:-0}" -ge 62 ]; then
  timeout "$(cap 200)" .gpu/bench --config tests/fixtures/qwen3/config-30b-a3b.json \
    --write-model /dev/shm/m-moe48 > "$OUT/w48.log" 2>&1
  echo "== write48 rc $? t=$((SECONDS - T0)): $(tail -1 "$OUT/w48.log")"
  sweep moe48 260 "--model-dir /dev/shm/m-moe48 --prompt 512 --batches 1 --new 128" "" "--no-graph-feed"
  rm -rf /dev/shm/m-moe48
else
  echo "== moe48 skipped: /dev/shm ${shm:-?} GB free"
fi
echo "done t=$((SECONDS - T0))"
