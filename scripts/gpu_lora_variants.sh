#!/usr/bin/env bash
# On the GPU machine (#23): the LoRA checks (kernel_check --lora-only), the LoRA kernels timed
# alone next to their base matmuls (graph_check --profile 8,64, 0.6B and 1.7B shapes), then
# decode tok/s with every row on one of 8 rank-16 adapters next to the base, per shape, for
# the default kernels and each of VARIANTS (';'-separated flag sets; default: --no-lora-grouped,
# --no-lora-overlap, both).
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
timeout 200 .gpu/kernel_check --model-dir /tmp/m-0.6b --lora-only > $OUT/kc-lora.log 2>&1; echo "kc rc $?"
grep -E "lora|checks" $OUT/kc-lora.log | grep -vE "^lora .* ok$" | cut -c1-120
grep -E "^lora BF16.*(decode|prefill)" $OUT/kc-lora.log | cut -c1-110
for m in 0.6b 1.7b; do
  timeout 100 .gpu/graph_check --model-dir /tmp/m-$m --profile 8,64 > $OUT/profile-$m.log 2>&1
  echo "== $m rc $?"; grep -A9 "LoRA kernels alone" $OUT/profile-$m.log; grep "grouped shrink .* by slices" $OUT/profile-$m.log
done
IFS=';' read -ra vs <<< ";${VARIANTS:---no-lora-grouped;--no-lora-overlap;--no-lora-grouped --no-lora-overlap}"
for shape in 0.6b 1.7b; do for v in "${vs[@]}"; do
  timeout 100 .gpu/bench --config tests/fixtures/qwen3/config-$shape.json --batches ${BATCHES:-8,16,64,256} \
    --new 128 --prompt 256 --no-peer --adapters 8 --adapter-rank 16 $v > $OUT/b.log 2>&1
  echo "== $shape [$v] rc $?"; grep -E "^(ours|lora) decode|Error" $OUT/b.log | sed 's/ (.*//' | paste -sd' '
done; done
