#!/usr/bin/env bash
# On the GPU machine, one call (#21): the decode layer kernel (`--layer-kernel MIB`, off by
# default). graph_check --layer-check on 0.6B and 1.7B (the layer kernel against the five
# launches a layer, eager and on graphs: the same bits up to 2,048 tokens), then decode at
# batches 1 and 2, default against --layer-kernel at three prefetch budgets, alternating.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b
for s in 0.6b 1.7b; do
  timeout 150 .gpu/graph_check --model-dir /tmp/m-$s --layer-check --layer-kernel 32 > "$OUT/layer-$s.log" 2>&1
  echo "== layer-check $s rc $?"; grep -E "^\||graph-check|Error|panic" "$OUT/layer-$s.log" | head -14
done
for r in 1 2; do for s in 0.6b 1.7b; do for v in "" "--layer-kernel 0" "--layer-kernel 24" "--layer-kernel 48"; do
  timeout 60 .gpu/bench --model-dir /tmp/m-$s --no-peer --new 128 --prompt 512 --batches 1,2 $v > "$OUT/b.log" 2>&1
  echo "== $s run $r [$v] rc $?"; grep -E "^ours decode|Error|panic" "$OUT/b.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done; done
