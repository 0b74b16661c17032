#!/usr/bin/env bash
# On the GPU machine, call 3 of round 34 (#21, #29): the committed defaults (the 3-4-row graphs
# in 16 partitions, the 5-16-row graphs in 8, eager steps on their bucket's partitions).
# 1. kernel_check --model-only and graph_check with the defaults.
# 2. Decode: batches 1, 2, 8 after 512-token prompts (two runs a shape: the floors' rows);
#    batches 1, 3, 8 after 8k, graphs and eager; 0.6B after 32k.
# 3. MoE (#29, 30B-A3B shape, 4 of 48 layers): the 1-row graph at 64 partitions (default)
#    against 32, batches 1 and 2 (never measured there).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; moe_model 4; echo "models t=$((SECONDS - T0))"
timeout 150 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
echo "== kc rc $? t=$((SECONDS - T0))"; grep -E "^kernel-check|FAILED|Error|panic" "$OUT/kc.log" | head -8
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 4000 > "$OUT/gc.log" 2>&1
echo "== gc rc $? t=$((SECONDS - T0))"; grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -14
for s in 0.6b 1.7b 0.6b 1.7b; do b "$s p512" --model-dir /tmp/m-$s --batches 1,2,8; done
for v in "" "--graph-splits-one 32" "" "--graph-splits-one 32"; do
  row "moe4 p256 ${v:-default}" --model-dir /tmp/m-moe4 --prompt 256 --new 64 --batches 1,2 $v
done
for s in 0.6b 1.7b; do b "$s p8000" --model-dir /tmp/m-$s --prompt 8000 --batches 1,3,8 --new 64 --compare-eager; done
row "0.6b p32000" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1,3,8 --new 32 --compare-eager
echo "done t=$((SECONDS - T0))"
