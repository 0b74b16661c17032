#!/usr/bin/env bash
# On the GPU machine, round 40's call 6 (#29; commit 3dca6a5's binaries, defaults only): the
# 30B-A3B shape's decode at 4, 8 and 16 layers for the per-layer cost and the 48-layer batch-1
# extrapolation, and graph_check on 4 layers with the defaults (call 5's "graphs on vs off"
# and "pipelined" rows failed with --moe-route-fold: the same rows on the defaults).
set -u
source scripts/gpu_lib.sh
moe_model 4; echo "models t=$((SECONDS - T0))"
timeout 150 .gpu/graph_check --model-dir /tmp/m-moe4 --stress-steps 200 > "$OUT/gc.log" 2>&1
echo "== gc moe4 default rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for l in 4 8 16; do
  left 400 || break
  moe_model $l; echo "moe$l written t=$((SECONDS - T0))"
  row "moe$l" --model-dir /tmp/m-moe$l --prompt 256 --batches 1,2,8 --new 64
  row "moe$l" --model-dir /tmp/m-moe$l --prompt 256 --batches 1,2,8 --new 64
  [ "$l" != 16 ] && rm -rf /tmp/m-moe$l
done
df -h /tmp | tail -1
echo "done t=$((SECONDS - T0))"
