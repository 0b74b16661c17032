#!/usr/bin/env bash
# Round 55, call 2 (#21): the fused attention's cluster merge without its second cluster
# barrier. Call 1's block timeline (0.6B, H100) put block 0's "every partial in" 1.7 us after
# the last block's push and its merge 2.3 us after that, of an ~11 us attention. Variants, all
# the same bits: --fused-async-push (the peers' partials by st.async onto block 0's mbarrier),
# --fused-inline-weights (the merge's weights inlined, not called), both. The timeline with
# each, kernel_check --model-only (the fused cases with both builds, bit for bit), then
# 0.6B and 1.7B batches 1, 2, 8 after 512-token prompts, two interleaved rounds.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round55a.sh` (with the build it ran on: both
# variants were then folded into the default build and their flags removed).
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
timelines 0.6b "" "--fused-async-push" "--fused-async-push --fused-inline-weights"
kc kcm 150 --model-dir /tmp/m-0.6b --model-only
counted "$OUT/kcm.log" "decode_fused async" "async"
sweep s06 200 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128" "" \
  "--fused-async-push" "--fused-inline-weights" "--fused-async-push --fused-inline-weights"
sweep s17 200 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128" "" \
  "--fused-async-push" "--fused-async-push --fused-inline-weights"
echo "done t=$((SECONDS - T0))"
