#!/usr/bin/env bash
# On the GPU machine, one call (#29): graph_check on the 4-layer 30B-A3B-shape model with the
# defaults and with --gqa8-split (now 1-2 rows only), then decode at batches 1, 2, 8 both ways.
set -u
source scripts/gpu_lib.sh
moe_model 4
for v in "" "--gqa8-split"; do
  timeout 200 .gpu/graph_check --model-dir /tmp/m-moe4 --stress-steps 100 $v > "$OUT/gc$v.log" 2>&1
  echo "== gc [$v] rc $?"; grep -E "graph-check|FAIL|engine|verify seq|^\| [0-9] \| [0-9]+ \|" "$OUT/gc$v.log" | head -16
done
for r in 1 2; do for v in "" "--gqa8-split"; do
  timeout 90 .gpu/bench --model-dir /tmp/m-moe4 --no-peer --new 64 --prompt 256 --batches 1,2,8 $v > "$OUT/b.log" 2>&1
  echo "== moe 4 layers run $r [$v] rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done
