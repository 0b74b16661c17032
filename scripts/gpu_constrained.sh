#!/usr/bin/env bash
# On the GPU machine (#26): kernel_check (mask_tokens_f32 among the rest), then decode tok/s
# with every row constrained (tool_choice required over tests/fixtures/tools/nested.json) next
# to unconstrained in one bench run, and the host's CPU time per mask per row.
set -u
source scripts/gpu_lib.sh
model 0.6b
timeout 200 .gpu/kernel_check --model-dir /tmp/m-0.6b > "$OUT/kernel_check.log" 2>&1
grep -E "mask_tokens|checks|failed" "$OUT/kernel_check.log" | tail -4 | tee -a "$S"
for shape in ${SHAPES:-0.6b}; do
  timeout 400 .gpu/bench --config tests/fixtures/qwen3/config-$shape.json --batches ${BATCHES:-1,8,64,256} \
    --new ${NEW:-128} --prompt 256 --no-peer --constrained > "$OUT/bench-$shape.log" 2>&1
  grep -E "^(ours|constrained)|grammar" "$OUT/bench-$shape.log" | grep -v prefill | sed "s/^/$shape /" | tee -a "$S"
done
