#!/usr/bin/env bash
# On the GPU machine, one call (#21): the streamed-rows gate|up matmuls (--gemv-stream N) and
# the double-buffered matmuls over more than 2,048 inputs (--gemv-double-buffer). Checks first
# (the new kernels against the default ones bit for bit, the model-level checks and greedy
# tokens, graphs vs eager with both on), then the batch-1 step's ops (graph_check --profile 1)
# and decode at batches 1, 2, 8 for both dense shapes with each variant.
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
V="--gemv-stream 2 --gemv-double-buffer"
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --gemv-only $V > $OUT/kc-gemv.log 2>&1
echo "kc gemv rc $?"; grep -E "^kernel-check|FAILED" $OUT/kc-gemv.log | head -8
grep -cE "(streamed|two batches).* ok$" $OUT/kc-gemv.log
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 $V > $OUT/gc.log 2>&1
echo "gc rc $?"; grep -E "graph-check|FAIL|mismatch" $OUT/gc.log | head -5
for m in 0.6b 1.7b; do for v in "" "$V"; do
  f="$OUT/prof-$m-${v// /}.log"
  timeout 60 .gpu/graph_check --model-dir /tmp/m-$m --profile 1 $v > "$f" 2>&1
  echo "== prof $m [$v] rc $?"; grep -E "^\| (add\+norm|o_proj \(ours|down \(ours)|graph_pdl 1" "$f" | cut -c1-90
done; done
for m in 0.6b 1.7b; do for v in "" "--gemv-stream 1" "--gemv-stream 2" "--gemv-double-buffer" "--gemv-stream 1 --gemv-double-buffer" "$V"; do
  timeout 80 .gpu/bench --no-peer --model-dir /tmp/m-$m --batches 1,2,8 $v > "$OUT/b-$m.log" 2>&1
  echo "== $m [$v] rc $?"; grep -E "^ours decode|Error" "$OUT/b-$m.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done
