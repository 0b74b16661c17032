#!/usr/bin/env bash
# On the GPU machine, one call (#21): the 1-2-row fused norms with the scale deferred to the
# dot products (--norm-deferred). Checks (every skinny matmul against f32 math with it on, the
# model-level checks and greedy tokens, graphs vs eager and the short stress run), the batch-1
# step's ops (graph_check --profile 1), decode at batches 1, 2, 8, 16 for both dense shapes,
# default and variant alternating, two runs each.
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
V="--norm-deferred"
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --gemv-only $V > $OUT/kc-gemv.log 2>&1
echo "kc gemv rc $?"; grep -E "^kernel-check|FAILED" $OUT/kc-gemv.log | head -8
grep -E "deferred" $OUT/kc-gemv.log | sort -k2 | awk '{print $(NF-3)}' | sort -g | tail -1 | sed 's/^/worst deferred rel_err /'
grep -cE "deferred.* ok$" $OUT/kc-gemv.log
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 $V > $OUT/gc.log 2>&1
echo "gc rc $?"; grep -E "graph-check|FAIL|mismatch" $OUT/gc.log | head -5
for m in 0.6b 1.7b; do for v in "" "$V"; do
  f="$OUT/prof-$m-${v// /}.log"
  timeout 60 .gpu/graph_check --model-dir /tmp/m-$m --profile 1 $v > "$f" 2>&1
  echo "== prof $m [$v] rc $?"; grep -E "^\| (add\+norm|argmax)|graph_pdl 1" "$f" | cut -c1-100
done; done
for m in 0.6b 1.7b; do for r in 1 2; do for v in "" "$V"; do
  timeout 80 .gpu/bench --no-peer --model-dir /tmp/m-$m --batches 1,2,8,16 $v > "$OUT/b-$m.log" 2>&1
  echo "== $m run $r [$v] rc $?"; grep -E "^ours decode|Error" "$OUT/b-$m.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done; done
