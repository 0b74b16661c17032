#!/usr/bin/env bash
# On the GPU machine, one call (#29): why graphs and eager steps of the 30B-A3B shape differ
# (graph_check --rows-check: does each cuBLAS matmul of the model's shapes give a row the same
# bits at an eager step's row count as inside its graph bucket?) on the MoE, 1.7B and 0.6B
# shapes; then kernel_check --model-only with the committed defaults (gqa8_split on).
set -u
source scripts/gpu_lib.sh
moe_model 4
model 0.6b; model 1.7b
for m in moe4 1.7b 0.6b; do
  timeout 150 .gpu/graph_check --model-dir /tmp/m-$m --rows-check > "$OUT/rows-$m.log" 2>&1
  echo "== rows $m rc $?"; grep -E "^\| [a-z]|graph-check|Error" "$OUT/rows-$m.log"
done
mix_model
timeout 240 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
echo "kc rc $?"; grep -E "^kernel-check|FAILED|Error|panic" "$OUT/kc.log" | head -8; grep -c "decode_fused whole" "$OUT/kc.log"
