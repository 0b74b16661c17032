#!/usr/bin/env bash
# Round 61, call 1 (#21): the fused attention's CUDA-core loop with each partition's second
# round of K/V staged in shared memory before its wait (`--fused-stage`, decode_fused_stage_*;
# 3+ rows, or contexts past one cluster). kernel_check --model-only and --fp8-only (its bits
# against the unfused kernels, bf16 and fp8 caches); 0.6B batches 1 / 2 / 4 / 8 and 1.7B
# batch 8 with it beside the defaults (three interleaved rounds), 0.6B batch 4 after 2k-token
# prompts (four rounds a partition); 0.6B batch 1 with --graph-splits-one 16; graph_check's
# stress run with it. On an H200 the floors' rows come first.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round61a.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc fused 150 --model-dir /tmp/m-0.6b --model-only
counted "$OUT/fused.log" "decode_fused stage" "stage"
grep "decode_fused stage" "$OUT/fused.log" | head -24
kc fp8 120 --model-dir /tmp/m-0.6b --fp8-only
counted "$OUT/fp8.log" "decode_fused stage" "fp8 stage"
sweep s06 150 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,4,8 --new 128 --variant-rounds 3" "" "--fused-stage"
sweep s17 100 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" "" "--fused-stage"
sweep l06 80 "--model-dir /tmp/m-0.6b --prompt 2000 --batches 4 --new 32 --variant-rounds 2" "" "--fused-stage"
sweep g06 60 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 --variant-rounds 3" "" "--graph-splits-one 16"
left 480 && { timeout "$(cap 90)" .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 \
  --fused-stage > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
