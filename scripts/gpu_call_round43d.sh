#!/usr/bin/env bash
# Round 43, call 4: the streamed layer's copies issued by a copy warp (lane w for compute warp
# w, full and empty mbarriers a slot), so the compute warps' barriers and fences no longer
# share a warp with copies in flight: graph_check --stream-check on 0.6B, then batch 1 after
# 512-token prompts by phase (--layer-stream-mode) at 8 pieces a warp, 4 and 10 whole.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stream-check --layer-stream 8 > "$OUT/sc.log" 2>&1
echo "== stream-check 0.6b rc $? t=$((SECONDS - T0))"
grep -E "^\||graph-check|Error|panic" "$OUT/sc.log" | cut -c1-150 | head -10
for m in 0.6b 1.7b; do
  row "$m default" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128
  for mode in 1 2 3 4 0 8; do
    row "$m ns 8 mode $mode" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 --layer-stream 8 --layer-stream-mode $mode
  done
  for ns in 4 10; do
    row "$m ns $ns mode 0" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 --layer-stream $ns
  done
done
echo "done t=$((SECONDS - T0))"
