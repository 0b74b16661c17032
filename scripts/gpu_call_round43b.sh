#!/usr/bin/env bash
# Round 43, call 2: the streamed decode layer with its merge's loads in flight together and
# profiling modes: graph_check --stream-check on both shapes (its drift beside the five
# launches with the unfused attention), then batch 1 after 512-token prompts with each
# launch stopped after phase 1-4 (A, B, D, E) and the barriers alone (--layer-stream-mode).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
for m in 0.6b 1.7b; do
  timeout 150 .gpu/graph_check --model-dir /tmp/m-$m --stream-check --layer-stream 8 > "$OUT/sc-$m.log" 2>&1
  echo "== stream-check $m rc $? t=$((SECONDS - T0))"
  grep -E "^\||graph-check|Error|panic" "$OUT/sc-$m.log" | cut -c1-150 | head -10
done
for m in 0.6b 1.7b; do
  row "$m default" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128
  for ns in 8 10; do
    for mode in 1 2 3 4 0 8; do
      row "$m ns $ns mode $mode" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 --layer-stream $ns --layer-stream-mode $mode
    done
  done
  row "$m ns 4 mode 0" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 --layer-stream 4
  row "$m ns 4 mode 8" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 --layer-stream 4 --layer-stream-mode 8
done
echo "done t=$((SECONDS - T0))"
