#!/usr/bin/env bash
# Round 43, call 5: the streamed step (every layer in one launch; the rings run on across
# layers): graph_check --stream-check on both shapes, then batch 1 after 512-token prompts at
# 4, 8 and 10 pieces a warp beside the default, its barriers alone, and after 2k / 8k.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
for m in 0.6b 1.7b; do
  timeout 150 .gpu/graph_check --model-dir /tmp/m-$m --stream-check --layer-stream 8 > "$OUT/sc-$m.log" 2>&1
  echo "== stream-check $m rc $? t=$((SECONDS - T0))"
  grep -E "^\||graph-check|Error|panic" "$OUT/sc-$m.log" | cut -c1-150 | head -10
done
for r in 1 2; do
  for m in 0.6b 1.7b; do
    for v in "" "--layer-stream 8" "--layer-stream 4" "--layer-stream 10"; do
      row "$m p512 b1 [$v] run $r" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 $v
    done
  done
done
for m in 0.6b 1.7b; do
  row "$m barriers alone" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 --layer-stream 8 --layer-stream-mode 8
  timeout 60 .gpu/graph_check --model-dir /tmp/m-$m --profile 1 --layer-stream 8 > "$OUT/prof.log" 2>&1
  echo "== profile $m rc $?: $(grep -E "graph_pdl 1: graph replay|Error" "$OUT/prof.log" | cut -c1-90 | paste -sd' ')"
done
for v in "" "--layer-stream 8"; do
  row "0.6b p2k b1 [$v]" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1 --new 128 $v
  row "0.6b p8k b1 [$v]" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1 --new 64 $v
  row "1.7b p2k b1 [$v]" --model-dir /tmp/m-1.7b --prompt 2000 --batches 1 --new 128 $v
done
echo "done t=$((SECONDS - T0))"
