#!/usr/bin/env bash
# On the GPU machine, one call (#21): the skinny matmuls with each block's weight rows in
# shared memory (--gemv-smem KIB, kernels/gemv_smem.cu). Checks first (the new kernels against
# the one-block-a-row-group kernels bit for bit at 100 and 226 KiB, the model-level checks and
# greedy tokens with them on, graphs vs eager and the short stress run), then the batch-1
# step's ops (graph_check --profile 1) and decode at batches 1, 2, 8 for both dense shapes.
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
V="--gemv-smem 100"
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --gemv-only $V > $OUT/kc-gemv.log 2>&1
echo "kc gemv rc $?"; grep -E "^kernel-check|FAILED" $OUT/kc-gemv.log | head -8
grep -E "launches served" $OUT/kc-gemv.log; grep -cE "KiB: shared memory.* ok$" $OUT/kc-gemv.log
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 $V > $OUT/gc.log 2>&1
echo "gc rc $?"; grep -E "graph-check|FAIL|mismatch" $OUT/gc.log | head -5
for m in 0.6b 1.7b; do for v in "" "$V"; do
  f="$OUT/prof-$m-${v// /}.log"
  timeout 60 .gpu/graph_check --model-dir /tmp/m-$m --profile 1 $v > "$f" 2>&1
  echo "== prof $m [$v] rc $?"; grep -E "^\| (add\+norm|o_proj \(ours|down \(ours)|graph_pdl 1" "$f" | cut -c1-90
done; done
for m in 0.6b 1.7b; do for v in "" "--gemv-smem 72" "$V" "--gemv-smem 140" "--gemv-smem 200"; do
  timeout 80 .gpu/bench --no-peer --model-dir /tmp/m-$m --batches 1,2,8 $v > "$OUT/b-$m.log" 2>&1
  echo "== $m [$v] rc $?"; grep -E "^ours decode|Error" "$OUT/b-$m.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done
