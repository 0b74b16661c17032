#!/usr/bin/env bash
# On the GPU machine, round 28 (#29): the fused decode attention for GQA group 8 with its
# partials merged in clusters of 8 (KernelOptions::fused_decode_g8, --fused-decode-g8; off by
# default: group 8 runs the unfused kernels). kernel_check --model-only --fused-decode-g8 (the
# fused kernel against the unfused ones, group 8 among them; the MoE model's forward with it
# against candle), the attention ops of a 2-layer model of the shape (graph_check --profile
# 1,8, both ways), decode on 12 of 48 layers at batches 1, 2, 8 both ways.
set -u
source scripts/gpu_lib.sh
CFG=tests/fixtures/qwen3/config-30b-a3b.json
python3 - "$CFG" > /tmp/cfg-mix.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 3; c["mlp_only_layers"] = [1]
print(json.dumps(c))
PY
[ -d /tmp/m-mix ] || timeout 200 .gpu/bench --config /tmp/cfg-mix.json --write-model /tmp/m-mix > /dev/null 2>&1
timeout 240 .gpu/kernel_check --model-dir /tmp/m-mix --model-only --fused-decode-g8 > $OUT/kc-moe.log 2>&1
echo "kc rc $?"; grep -E "kernel-check|FAILED|decode_fused.*nh 32|greedy|decode" $OUT/kc-moe.log | cut -c1-130 | head -30
[ -d /tmp/m-moe2 ] || timeout 120 .gpu/bench --config $CFG --layers 2 --write-model /tmp/m-moe2 > /dev/null 2>&1
for v in "" "--fused-decode-g8"; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-moe2 --profile 1,8 $v > $OUT/profile$v.log 2>&1
  echo "== profile [$v] rc $?"; grep -iE "attention|qk_norm|paged|replay|^## " $OUT/profile$v.log | head -16
done
SKIP_HF=1 SKIP_CHECK=1 LAYERS_BENCH=12 BENCH_ARGS="--prompt 256 --batches 1,2,8" VARIANTS="--fused-decode-g8" \
  bash scripts/gpu_moe.sh
