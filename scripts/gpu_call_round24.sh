#!/usr/bin/env bash
# On the GPU machine, one call (#23): the LoRA checks (kernel_check --lora-only: the grouped
# kernels against the one-token ones, the model's logits for every variant), the LoRA kernels
# alone at 16 and 64 rows, and decode with every row on one of 8 rank-16 adapters for the
# defaults (overlap + grouped) and --no-lora-grouped (the overlap alone), both shapes, the
# base rows in the same runs.
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --lora-only > $OUT/kc-lora.log 2>&1; echo "kc rc $?"
grep -E "checks|FAILED|greedy" $OUT/kc-lora.log | cut -c1-120
for m in 0.6b 1.7b; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-$m --profile 16,64 > $OUT/profile-$m.log 2>&1
  echo "== $m rc $?"; grep -A8 "LoRA kernels alone" $OUT/profile-$m.log | grep -E "^\| (qkv|o|gate|down)|^sum|^## "
done
for shape in 0.6b 1.7b; do for v in "" "--no-lora-grouped"; do
  timeout 90 .gpu/bench --config tests/fixtures/qwen3/config-$shape.json --batches 8,16,32,64,256 \
    --new 128 --prompt 256 --no-peer --adapters 8 --adapter-rank 16 $v > $OUT/b-$shape.log 2>&1
  echo "== $shape [$v] rc $?"; grep -E "^(ours|lora) decode|Error" $OUT/b-$shape.log | sed 's/ (.*//' | sed 's/ decode batch /@/; s/ tok\/s//' | paste -sd' '
done; done
