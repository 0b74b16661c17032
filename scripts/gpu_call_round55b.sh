#!/usr/bin/env bash
# Round 55, call 3 (#21): the one-cluster merge scattered over the cluster's blocks
# (--fused-scatter-merge: every block merges G * HD / C outputs; call 2's timeline had block 0's
# merge at 2.9-3.1 us of the 1-row attention's 9.7). The same bits: kernel_check --model-only
# (the fused cases with the scattered build, bit for bit), the timeline with and without it,
# then 0.6B and 1.7B batches 1, 2, 8 after 512-token prompts and the 30B-A3B shape at 8 layers
# batches 1 and 8, two interleaved rounds.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round55b.sh` (with the build it ran on: its
# variant flags were removed, or folded into the defaults, after it ran).
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc kcm 150 --model-dir /tmp/m-0.6b --model-only
counted "$OUT/kcm.log" "decode_fused scatter" "scatter"
timelines 0.6b "" "--fused-scatter-merge"
sweep s06 150 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128" "" \
  "--fused-scatter-merge"
sweep s17 150 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128" "" \
  "--fused-scatter-merge"
moe_model 8; echo "moe8 t=$((SECONDS - T0))"
sweep moe8 150 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1,8 --new 128" "" \
  "--fused-scatter-merge"
echo "done t=$((SECONDS - T0))"
