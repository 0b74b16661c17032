#!/usr/bin/env bash
# On the GPU machine, the last call (#29, #21): the committed defaults (cuBLAS on its row
# class's algorithm, gqa8_split): kernel_check --model-only on the mixed 3-layer 30B-A3B-shape
# model (kernels against candle: prefill, chunked prefill, decode 8/2/1 rows), then graph_check
# on 0.6B (every bucket, verify, shrink/grow, engine graphs on/off, a short stress run).
set -u
source scripts/gpu_lib.sh
mix_model
timeout 150 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
echo "kc rc $?"; grep -E "^kernel-check|FAILED|Error|panic" "$OUT/kc.log" | head -8
model 0.6b
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 100 > "$OUT/gc.log" 2>&1
echo "gc rc $?"; grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-220 | head -10
