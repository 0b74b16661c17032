#!/usr/bin/env bash
# Round 43, call 3: the streamed layer's norms with every load in flight at once and their
# weights staged before the wait: graph_check --stream-check on 0.6B, then batch 1 after
# 512-token prompts by phase (--layer-stream-mode) at 4 and 8 pieces a warp.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stream-check --layer-stream 8 > "$OUT/sc.log" 2>&1
echo "== stream-check 0.6b rc $? t=$((SECONDS - T0))"
grep -E "^\||graph-check|Error|panic" "$OUT/sc.log" | cut -c1-150 | head -10
for m in 0.6b 1.7b; do
  row "$m default" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128
  for ns in 8 4; do
    for mode in 1 2 3 4 0 8; do
      row "$m ns $ns mode $mode" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 --layer-stream $ns --layer-stream-mode $mode
    done
  done
done
echo "done t=$((SECONDS - T0))"
