#!/usr/bin/env bash
# (Recorded as run in round 64, before --gemv-tma-head-argmax became the default and its flag
# --no-gemv-tma-head-argmax: the variants below no longer parse.)
# Round 63, call 2 (#21): the lm_head of 1-row steps on the streamed kernel
# (--gemv-tma-head 8) and the one-launch greedy head (--gemv-tma-head-argmax) beside the
# defaults, three interleaved rounds: 0.6B batches 1 / 8 (on an H200 also the floors' rows),
# then kernel_check --gemv-only (its lm_head rows and its count), then 1.7B batches 1 / 8.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round63b.sh`.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
sweep h06 170 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" "" \
  "--gemv-tma-head 8" "--gemv-tma-head 8 --gemv-tma-head-argmax"
left && kc kc 150 --model-dir /tmp/m-0.6b --gemv-only && counted "$OUT/kc.log" "lm_head" "lm_head" \
  && grep -E "lm_head" "$OUT/kc.log" | head -24
sweep h17 110 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" "" \
  "--gemv-tma-head 8 --gemv-tma-head-argmax"
echo "done t=$((SECONDS - T0))"
