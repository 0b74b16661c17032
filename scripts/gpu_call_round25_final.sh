#!/usr/bin/env bash
# On the GPU machine, one call (#21): the streamed gate|up and double-buffered matmuls on by
# default. Every kernel check and graph check with the defaults (the full stress run too), the
# short stress run with the old and the new skinny matmuls (a short run's pool high-water mark),
# decode with the defaults at batches 1-1024 for both dense shapes, and 3 blocks an SM.
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
timeout 240 .gpu/kernel_check --model-dir /tmp/m-0.6b > $OUT/kc.log 2>&1
echo "kc rc $?"; grep -E "^kernel-check|FAILED" $OUT/kc.log | head -8
timeout 200 .gpu/graph_check --model-dir /tmp/m-0.6b > $OUT/gc.log 2>&1
echo "gc rc $?"; grep -E "graph-check|FAIL|shrink|engine graphs|^stress" $OUT/gc.log | cut -c1-200 | head -8
for v in "--no-gemv-stream --no-gemv-double-buffer" ""; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-only --stress-steps 300 $v > $OUT/gcs.log 2>&1
  echo "== short stress [$v] rc $?"; grep -oE "pool used grew [0-9.]+ MiB|device memory MiB.*-> free [0-9]+ \(pool used [0-9.]+" $OUT/gcs.log | cut -c1-400
done
for m in 0.6b 1.7b; do
  timeout 170 .gpu/bench --no-peer --model-dir /tmp/m-$m --batches 1,8,64,256,512,1024 > "$OUT/bd-$m.log" 2>&1
  echo "== $m defaults rc $?"; grep -E "^ours decode|Error" "$OUT/bd-$m.log" | cut -c1-120
done
for m in 0.6b 1.7b; do
  timeout 60 .gpu/bench --no-peer --model-dir /tmp/m-$m --batches 1,2 --gemv-stream 3 > "$OUT/b3-$m.log" 2>&1
  echo "== $m [--gemv-stream 3] rc $?"; grep -E "^ours decode|Error" "$OUT/b3-$m.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done
# What profilers the machine has (for the next round's stall analysis).
ls /usr/local/cuda/bin 2>/dev/null | grep -E "^(ncu|nsys|nvprof|cupti)" ; which ncu nsys 2>/dev/null; ls -d /usr/local/cuda/nsight* /opt/nvidia/nsight* 2>/dev/null | head
