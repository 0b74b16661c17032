#!/usr/bin/env bash
# Round 60, call 5 (#21): o's 1-row matmul prefetching into L2 the gate|up rows that kernel
# loads after its wait (`--o-prefetch-mlp MIB`, `gemv_pfm_t1_bf16`; 1.7B: the third batch,
# 2 x 7.9 MB), issued after o's own loads while the attention runs. kernel_check --gemv-only
# (its bits against the plain kernel, and where it launches), after the floors' rows on an
# H200; 1.7B batches 1 and 2 with 16, 8 and 4 MiB beside the defaults, three interleaved
# rounds; graph_check's stress run with 16 MiB.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round60c.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
case $gpu in *H200*)
  sweep d17 100 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" ""
  sweep d06 80 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" ;;
esac
kc gemv 150 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "o prefetching" "o prefetch"
grep "o prefetching" "$OUT/gemv.log" | head -12
sweep p17 150 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2 --new 128 --variant-rounds 3" "" \
  "--o-prefetch-mlp 16" "--o-prefetch-mlp 8" "--o-prefetch-mlp 4"
left 420 && { timeout "$(cap 90)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 \
  --o-prefetch-mlp 16 > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
