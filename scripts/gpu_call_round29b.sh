#!/usr/bin/env bash
# On the GPU machine, one call (#21): the argmax in parts read as float4 (checks: random rows
# against candle, tied rows against the lowest index), and the fused decode attention
# prefetching the layer's next weights into L2 (--attn-prefetch MIB): the model-level checks
# and greedy tokens with it on, graphs vs eager and the short stress run, the batch-1 step
# (graph_check --profile 1), decode at batches 1, 2, 8, 16 for both dense shapes.
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
V="--attn-prefetch 24"
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --gemv-only $V > $OUT/kc-gemv.log 2>&1
echo "kc gemv rc $?"; grep -E "^kernel-check|FAILED" $OUT/kc-gemv.log | head -8; grep -E "^argmax" $OUT/kc-gemv.log
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 $V > $OUT/gc.log 2>&1
echo "gc rc $?"; grep -E "graph-check|FAIL|mismatch" $OUT/gc.log | head -5
for m in 0.6b 1.7b; do for v in "" "$V"; do
  f="$OUT/prof-$m-${v// /}.log"
  timeout 60 .gpu/graph_check --model-dir /tmp/m-$m --profile 1 $v > "$f" 2>&1
  echo "== prof $m [$v] rc $?"; grep -E "^\| (argmax|to_f32)|graph_pdl 1" "$f" | cut -c1-100
done; done
for m in 0.6b 1.7b; do for v in "" "--attn-prefetch 16" "$V" "--attn-prefetch 40"; do
  timeout 80 .gpu/bench --no-peer --model-dir /tmp/m-$m --batches 1,2,8,16 $v > "$OUT/b-$m.log" 2>&1
  echo "== $m [$v] rc $?"; grep -E "^ours decode|Error" "$OUT/b-$m.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done
