#!/usr/bin/env bash
# On the GPU machine (#23): the run LoRA shrink (on by default; --no-lora-runs). PART=checks: kernel_check
# --lora-only (the run shrink against the one-token one, the model's logits, graphs vs
# eager), the LoRA kernels alone at 16/32/64 rows; then, for each shape of SHAPES (default
# 0.6b), decode with every row on one of 8 rank-16 adapters for each of VARIANTS
# (';'-separated flag sets; default: none, --no-lora-runs; calls 1-3 of round 26 ran with the
# option off by default and VARIANTS naming --lora-runs).
set -u
source scripts/gpu_lib.sh
for m in ${SHAPES:-0.6b}; do model $m; done
if [ "${PART:-checks}" = checks ]; then
  model 0.6b
  timeout 240 .gpu/kernel_check --model-dir /tmp/m-0.6b --lora-only > $OUT/kc-lora.log 2>&1; echo "kc rc $?"
  grep -E "checks|FAILED|greedy" $OUT/kc-lora.log | cut -c1-140
  grep -E "^lora BF16.*(runs|decode 1)" $OUT/kc-lora.log | cut -c1-120 | head -12
  for m in 0.6b 1.7b; do
    model $m
    timeout 60 .gpu/graph_check --model-dir /tmp/m-$m --profile 16,32,64 > $OUT/profile-$m.log 2>&1
    echo "== $m rc $?"; grep -A8 "LoRA kernels alone" $OUT/profile-$m.log | grep -E "^\| (qkv|o|gate|down|SiLU)|^sum|^## "
  done
fi
IFS=';' read -ra vs <<< "${VARIANTS:-;--no-lora-runs}"
for shape in ${SHAPES:-0.6b}; do for v in "${vs[@]}"; do
  timeout ${BENCH_TIMEOUT:-80} .gpu/bench --config tests/fixtures/qwen3/config-$shape.json --batches ${BATCHES:-8,16,32,64} \
    --new 128 --prompt 256 --no-peer --adapters 8 --adapter-rank 16 $v > $OUT/b-$shape.log 2>&1
  echo "== $shape [$v] rc $?"; grep -E "^(ours|lora) decode|Error" $OUT/b-$shape.log | sed 's/ (.*//' | sed 's/ decode batch /@/; s/ tok\/s//' | paste -sd' '
done; done
