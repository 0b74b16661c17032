#!/usr/bin/env bash
# On the GPU machine, round 28, the final code: kernel_check --lora-only (0.6B shape) and
# --model-only (the 3-layer MoE model with a dense layer), then decode with every row on one of
# 8 rank-16 adapters at batches 8 and 64, both shapes (the committed defaults).
set -u
source scripts/gpu_lib.sh; model 0.6b
timeout 240 .gpu/kernel_check --model-dir /tmp/m-0.6b --lora-only > $OUT/kc-lora.log 2>&1
echo "kc lora rc $?"; grep -E "kernel-check|FAILED|wide" $OUT/kc-lora.log | cut -c1-130 | tail -10
python3 - tests/fixtures/qwen3/config-30b-a3b.json > /tmp/cfg-mix.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 3; c["mlp_only_layers"] = [1]
print(json.dumps(c))
PY
[ -d /tmp/m-mix ] || timeout 200 .gpu/bench --config /tmp/cfg-mix.json --write-model /tmp/m-mix > /dev/null 2>&1
timeout 200 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > $OUT/kc-moe.log 2>&1
echo "kc moe rc $?"; grep -E "kernel-check|FAILED" $OUT/kc-moe.log | cut -c1-130 | tail -5
PART=none SHAPES="0.6b 1.7b" BATCHES=8,64 VARIANTS=";" bash scripts/gpu_call_round26.sh
