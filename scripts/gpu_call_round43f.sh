#!/usr/bin/env bash
# Round 43, call 6: the streamed step's copy lanes polling without blocking and converged
# (mbarrier.test_wait; a lane waiting on its slot no longer holds the other seven back):
# graph_check --stream-check on 0.6B, batch 1 after 512-token prompts at 4, 8 and 10 pieces
# a warp beside the default on both shapes, two interleaved runs, and after 2k.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stream-check --layer-stream 8 > "$OUT/sc.log" 2>&1
echo "== stream-check 0.6b rc $? t=$((SECONDS - T0))"
grep -E "^\||graph-check|Error|panic" "$OUT/sc.log" | cut -c1-150 | head -10
for r in 1 2; do
  for m in 0.6b 1.7b; do
    for v in "" "--layer-stream 8" "--layer-stream 4" "--layer-stream 10"; do
      row "$m p512 b1 [$v] run $r" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 $v
    done
  done
done
for v in "" "--layer-stream 8"; do
  row "0.6b p2k b1 [$v]" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1 --new 128 $v
done
echo "done t=$((SECONDS - T0))"
