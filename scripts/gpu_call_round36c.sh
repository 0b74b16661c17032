#!/usr/bin/env bash
# On the GPU machine, call 3 of round 36 (#21): the LoRA and fp8-KV checks on the committed
# defaults (the unnormed tensor-core skinny matmuls now serve their 3-8-row steps too; verify
# steps ran in call 2's graph_check).
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --lora-only > "$OUT/kcl.log" 2>&1
echo "== kc lora rc $? t=$((SECONDS - T0))"; grep -E "^kernel-check|FAIL|Error|panic" "$OUT/kcl.log" | head -8
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --fp8-only > "$OUT/kc8.log" 2>&1
echo "== kc fp8 rc $? t=$((SECONDS - T0))"; grep -E "^kernel-check|FAIL|Error|panic" "$OUT/kc8.log" | head -8
echo "done t=$((SECONDS - T0))"
