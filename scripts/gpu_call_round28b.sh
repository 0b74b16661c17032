#!/usr/bin/env bash
# On the GPU machine, round 28 (#29): the fused decode attention for GQA group 8 with its
# partials merged in clusters of 8 (on by default; --no-fused-decode runs the unfused kernels,
# the old path for the 30B-A3B shape). kernel_check --model-only (the fused kernel against the
# unfused ones, group 8 among them; the MoE model's kernels against candle), the attention ops
# of a 2-layer model of the shape (graph_check --profile 1,8), decode on 12 of 48 layers at
# batches 1, 2, 8 with both paths.
set -u
source scripts/gpu_lib.sh
CFG=tests/fixtures/qwen3/config-30b-a3b.json
[ -d /tmp/m-moe2 ] || timeout 120 .gpu/bench --config $CFG --layers 2 --write-model /tmp/m-moe2 > /dev/null 2>&1
for v in "" "--no-fused-decode"; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-moe2 --profile 1,8 $v > $OUT/profile$v.log 2>&1
  echo "== profile [$v] rc $?"; grep -iE "attention|qk_norm|paged|replay|^## " $OUT/profile$v.log | head -16
done
SKIP_HF=1 LAYERS_BENCH=12 BENCH_ARGS="--prompt 256 --batches 1,2,8" VARIANTS="--no-fused-decode" \
  bash scripts/gpu_moe.sh
