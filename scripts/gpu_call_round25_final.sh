#!/usr/bin/env bash
# On the GPU machine, one call (#21): the streamed gate|up and double-buffered matmuls on by
# default (call 2 measured them at batches 1, 2, 8; more rows run cuBLAS, which they do not
# change). Every kernel check and the graph checks with the defaults; then the down on two warps
# a row (--gemv-split-k) and 3 blocks an SM at batches 1-2 and the split's batch-1 profile; the
# short stress run with the old skinny matmuls (a short run's pool high-water mark); last, the
# profilers the machine has.
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
timeout 180 .gpu/kernel_check --model-dir /tmp/m-0.6b > $OUT/kc.log 2>&1
echo "kc rc $?"; grep -E "^kernel-check|FAILED" $OUT/kc.log | head -8
grep -E "two warps a row" $OUT/kc.log | sort -k9 -g | tail -2
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1000 > $OUT/gc.log 2>&1
echo "gc rc $?"; grep -E "graph-check|FAIL|shrink|engine graphs" $OUT/gc.log | cut -c1-160 | head -8
grep -oE "pool used grew [0-9.]+ MiB" $OUT/gc.log
for v in "--gemv-split-k" "--gemv-stream 3"; do for m in 1.7b 0.6b; do
  timeout 50 .gpu/bench --no-peer --model-dir /tmp/m-$m --batches 1,2 $v > "$OUT/b3-$m.log" 2>&1
  echo "== $m [$v] rc $?"; grep -E "^ours decode|Error" "$OUT/b3-$m.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done
timeout 40 .gpu/graph_check --model-dir /tmp/m-1.7b --profile 1 --gemv-split-k > $OUT/prof-split.log 2>&1
echo "== prof 1.7b split rc $?"; grep -E "^\| (down \(ours)|graph_pdl 1" $OUT/prof-split.log | cut -c1-90
timeout 40 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-only --stress-steps 300 --no-gemv-stream --no-gemv-double-buffer > $OUT/gcs.log 2>&1
echo "== short stress, old matmuls rc $?"; grep -oE "pool used grew [0-9.]+ MiB|device memory MiB.*-> free [0-9]+ \(pool used [0-9.]+" $OUT/gcs.log | cut -c1-400
ls /usr/local/cuda/bin 2>/dev/null | grep -E "^(ncu|nsys)" ; which ncu nsys 2>/dev/null
