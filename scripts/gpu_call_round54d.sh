#!/usr/bin/env bash
# Round 54, call 5 (#21): where the qkv and the attention let the next launch in. Call 2 found
# 0.6B's qkv on 4 rows a warp faster alone (3.1 against 3.8 us on the H200) and, followed by o
# with the attention left out, a step 34 us shorter; but followed by the attention the step was
# 36 us longer: the attention's blocks, which then find room to start beside the qkv's, cost
# more than they hide. --norm-gemv-trigger wait/end let the attention in only past the qkv's
# wait / at its end; --fused-late-trigger lets o in only once the attention's blocks are past
# their loop. All the same bits. kernel_check --gemv-only (the triggers' kernels bit for bit)
# and --model-only with the late-trigger attention, then 0.6B batches 1 and 2 after 512-token
# prompts, three interleaved rounds.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round54d.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; echo "models t=$((SECONDS - T0))"
kc kcg 100 --model-dir /tmp/m-0.6b --gemv-only
echo "rows checks: $(grep -c "rows a warp" "$OUT/kcg.log"), failed: $(grep "rows a warp" "$OUT/kcg.log" | grep -c FAIL)"
kc kclt 90 --model-dir /tmp/m-0.6b --model-only --fused-late-trigger
echo "fused checks: $(grep -ci "fused" "$OUT/kclt.log"), failed: $(grep -i "fused" "$OUT/kclt.log" | grep -c FAIL)"
sweep d06 200 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 --variant-rounds 3" "" \
  "--norm-gemv-rows 4 --norm-gemv-trigger wait" "--norm-gemv-rows 4 --norm-gemv-trigger end" \
  "--fused-late-trigger" "--fused-late-trigger --norm-gemv-rows 4" \
  "--fused-late-trigger --norm-gemv-rows 4 --norm-gemv-trigger end"
echo "done t=$((SECONDS - T0))"
