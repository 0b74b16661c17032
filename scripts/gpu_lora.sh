#!/usr/bin/env bash
# On the GPU machine (#23): kernel_check (the LoRA checks among the rest: kernels vs candle
# ops on mixed batches, graphs vs eager greedy answers; LORA_ONLY=1: only those), then decode
# tok/s with every row on one of 8 rank-16 adapters (all seven projections) next to the base
# in one bench run per shape, and each adapter's read+check time. VARIANTS: kernel flags
# whose checks and bench rows run after the default's, each its own run, tagged by the flag
# (e.g. VARIANTS="--no-lora-overlap"; SKIP_VARIANT_CHECK=1: the variants' benches only).
set -u
source scripts/gpu_lib.sh
model 0.6b
only=""; [ "${LORA_ONLY:-0}" = 1 ] && only="--lora-only"
for v in "" ${VARIANTS:-}; do
  tag=${v:-default}
  if [ -z "$v" ] || [ -z "${SKIP_VARIANT_CHECK:-}" ]; then
    timeout 200 .gpu/kernel_check --model-dir /tmp/m-0.6b $only $v > "$OUT/kernel_check$v.log" 2>&1
    grep -E "lora|checks|failed|FAILED" "$OUT/kernel_check$v.log" | tail -${CHECK_LINES:-16} | sed "s/^/$tag /" | tee -a "$S"
  fi
  for shape in ${SHAPES:-0.6b 1.7b}; do
    timeout 100 .gpu/bench --config tests/fixtures/qwen3/config-$shape.json --batches ${BATCHES:-8,64,256} \
      --new ${NEW:-128} --prompt 256 --no-peer --adapters ${ADAPTERS:-8} --adapter-rank 16 $v \
      > "$OUT/bench-$shape$v.log" 2>&1
    grep -E "^(ours|lora)|adapter" "$OUT/bench-$shape$v.log" | grep -vE "^(ours|lora) (prefill|batched|first)" | sed "s/^/$tag $shape /" | tee -a "$S"
  done
done
