#!/usr/bin/env bash
# On the GPU machine, one call (#29, #21): cuBLAS matmuls on their row class's cuBLASLt
# algorithm (blas_row_class, on). graph_check --rows-check (each matmul of the MoE, 1.7B and
# 0.6B shapes: a row at M rows against the same row inside its bucket, cuBLAS's own choice
# and the row class's); graph_check on the 4-layer 30B-A3B shape (graphs against eager); decode
# at batches 8-256 on 0.6B and 1.7B with and without it; MoE decode at 1, 2, 8.
set -u
source scripts/gpu_lib.sh
moe_model 4
model 0.6b; model 1.7b
for m in moe4 1.7b 0.6b; do
  timeout 150 .gpu/graph_check --model-dir /tmp/m-$m --rows-check > "$OUT/rows-$m.log" 2>&1
  echo "== rows $m rc $?"; grep -E "^\| [a-z]|graph-check|Error|^row|^cuBLAS" "$OUT/rows-$m.log"
done
timeout 200 .gpu/graph_check --model-dir /tmp/m-moe4 --stress-steps 100 > "$OUT/gc.log" 2>&1
echo "== gc moe4 rc $?"; grep -E "graph-check|FAIL|engine|shrink" "$OUT/gc.log" | head -12
for s in 0.6b 1.7b; do for v in "" "--no-blas-row-class"; do
  timeout 90 .gpu/bench --model-dir /tmp/m-$s --no-peer --batches 8,16,64,256 $v > "$OUT/b.log" 2>&1
  echo "== $s [$v] rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done
timeout 90 .gpu/bench --model-dir /tmp/m-moe4 --no-peer --new 64 --prompt 256 --batches 1,2,8 > "$OUT/b.log" 2>&1
echo "== moe4 rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
