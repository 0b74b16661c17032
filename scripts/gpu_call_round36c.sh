#!/usr/bin/env bash
# On the GPU machine, call 3 of round 36 (#21): the LoRA and fp8-KV checks on the committed
# defaults (the unnormed tensor-core skinny matmuls now serve their 3-8-row steps too; verify
# steps ran in call 2's graph_check).
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
kc kcl 150 --model-dir /tmp/m-0.6b --lora-only
kc kc8 150 --model-dir /tmp/m-0.6b --fp8-only
echo "done t=$((SECONDS - T0))"
