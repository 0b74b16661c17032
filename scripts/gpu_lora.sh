#!/usr/bin/env bash
# On the GPU machine (#23): kernel_check (the LoRA checks among the rest: kernels vs candle
# ops on mixed batches, graphs vs eager greedy answers), then decode tok/s with every row on
# one of 8 rank-16 adapters (all seven projections) next to the base in one bench run per
# shape, and each adapter's read+check time.
set -u
source scripts/gpu_lib.sh
model 0.6b
timeout 100 .gpu/kernel_check --model-dir /tmp/m-0.6b > "$OUT/kernel_check.log" 2>&1
grep -E "lora|checks|failed|FAILED" "$OUT/kernel_check.log" | tail -16 | tee -a "$S"
for shape in ${SHAPES:-0.6b 1.7b}; do
  timeout 100 .gpu/bench --config tests/fixtures/qwen3/config-$shape.json --batches ${BATCHES:-8,64,256} \
    --new ${NEW:-128} --prompt 256 --no-peer --adapters ${ADAPTERS:-8} --adapter-rank 16 \
    > "$OUT/bench-$shape.log" 2>&1
  grep -E "^(ours|lora)|adapter" "$OUT/bench-$shape.log" | grep -v prefill | sed "s/^/$shape /" | tee -a "$S"
done
