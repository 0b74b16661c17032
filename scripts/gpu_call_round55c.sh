#!/usr/bin/env bash
# Round 55, call 5 (#21): is block 0's slow merge its instruction fetch? --fused-warm-merge (the
# peers run block 0's merge code with nothing to merge before they exit, so the SM that next
# hosts a block 0 has that code cached) beside the defaults and call 3's --fused-scatter-merge.
# The same bits: kernel_check --model-only (the fused cases with the warm build's two-stage
# kernels, bit for bit), the 0.6B timeline with each, then 0.6B, 1.7B batches 1, 2, 8 and the
# 30B-A3B shape at 8 layers batches 1, 8 after 512-token prompts, two interleaved rounds.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round55c.sh` (with the build it ran on: its
# variant flags were removed, or folded into the defaults, after it ran).
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc kcm 150 --model-dir /tmp/m-0.6b --model-only
counted "$OUT/kcm.log" "decode_fused warm" "warm"
timelines 0.6b "" "--fused-warm-merge"
sweep s06 150 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128" "" \
  "--fused-warm-merge" "--fused-scatter-merge"
sweep s17 150 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128" "" \
  "--fused-warm-merge"
moe_model 8; echo "moe8 t=$((SECONDS - T0))"
sweep moe8 150 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1,8 --new 128" "" \
  "--fused-warm-merge"
echo "done t=$((SECONDS - T0))"
