#!/usr/bin/env bash
# Round 53, call 1 (#21, #29): the floors on the defaults of c478cdb (the graph feed on), with
# --no-graph-feed beside them, on whatever GPU is lent (the floors are stated on the H200: say
# which card gave each row): 0.6B and 1.7B at batches 1 and 8 after 512-token prompts, the
# 30B-A3B shape at 8 layers and, if /dev/shm holds it, all 48 (batch 1); graph_check's stress
# run on the 8-layer MoE model with the like-with-like probe (c478cdb).
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round53.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
model 0.6b; model 1.7b; moe_model 8; echo "models t=$((SECONDS - T0))"
sweep d06 90 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128" "" "--no-graph-feed"
sweep d17 90 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128" "" "--no-graph-feed"
sweep moe8 80 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128" "" "--no-graph-feed"
left && { timeout "$(cap 100)" .gpu/graph_check --model-dir /tmp/m-moe8 --stress-steps 200 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic|stress" "$OUT/gc.log" | cut -c1-400 | head; }
shm=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
if [ "${shm:-0}" -ge 62 ] && left 330; then
  timeout 150 .gpu/bench --config tests/fixtures/qwen3/config-30b-a3b.json \
    --write-model /dev/shm/m-moe48 > "$OUT/w48.log" 2>&1
  echo "== write48 rc $? t=$((SECONDS - T0)): $(tail -1 "$OUT/w48.log")"
  sweep moe48 150 "--model-dir /dev/shm/m-moe48 --prompt 512 --batches 1 --new 128" ""
  rm -rf /dev/shm/m-moe48
else
  echo "== moe48 skipped: /dev/shm ${shm:-?} GB free, t=$((SECONDS - T0))"
fi
echo "done t=$((SECONDS - T0))"
