#!/usr/bin/env bash
# One device call for the long-prompt prefill issue (#20): every prefill kernel against the
# references (kernel_check, with the attention-only timing table), then the engine's prefill of
# one 2k/8k/16k/32k prompt and 8 of each (0.6B), 32k (1.7B), the other prefill kernels and
# chunk sizes for comparison, and (HF=1) transformers' SDPA forward of the same lengths.
# Expects .gpu/{bench,kernel_check}.xz (scripts/gpu_unpack.sh).
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$S"
model 0.6b; model 1.7b
t0=$(date +%s)
timeout 220 .gpu/kernel_check --model-dir /tmp/m-0.6b > "$OUT/kernel_check.log" 2>&1
echo "kernel_check exit $? ($(( $(date +%s) - t0 )) s)" | tee -a "$S"
grep -E "FAIL|kernel-check|prefill-attention" "$OUT/kernel_check.log" | tee -a "$S"
for p in 2048 8192 16384 32000; do run 0.6b-$p --model-dir /tmp/m-0.6b --prompt $p; done
run 1.7b-32000 --model-dir /tmp/m-1.7b --prompt 32000
run 0.6b-32000-mma --model-dir /tmp/m-0.6b --prompt 32000 --no-wgmma-prefill
# Chunk size: the prompt's time alone and with 8 sequences decoding (the longest decode stall).
for c in ${CHUNKS:-}; do run 0.6b-32000-mixed-chunk$c --model-dir /tmp/m-0.6b --prompt 32000 --batches 16 --mixed --prefill-chunk $c --max-batched-tokens $(( c + 256 )); done
if [ "${B8:-0}" = 1 ]; then
  model 8b
  for p in 2048 8192 32000; do run 8b-$p --model-dir /tmp/m-8b --prompt $p; done
  timeout 150 python3 scripts/hf_prefill_bench.py tests/fixtures/qwen3/config-8b.json 2048,8192,32000 2>&1 | grep hf-prefill | tee -a "$S"
fi
if [ "${HF:-0}" = 1 ]; then
  timeout 150 python3 scripts/hf_prefill_bench.py tests/fixtures/qwen3/config-0.6b.json 2048,8192,16384,32000 2>&1 | grep hf-prefill | tee -a "$S"
  timeout 90 python3 scripts/hf_prefill_bench.py tests/fixtures/qwen3/config-1.7b.json 32000 2>&1 | grep hf-prefill | tee -a "$S"
fi
