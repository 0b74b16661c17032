#!/usr/bin/env bash
# On the GPU machine, round 39's call 1 (#21): the unfused attention by context and by rows.
# KernelOptions::fused_long_ctx (--fused-long-ctx N: decode steps whose longest context passes
# N tokens run the attention unfused on tensor cores, graphs captured a second time for them)
# and KernelOptions::fused_max_rows (--fused-max-rows N: steps of more rows run it unfused),
# built after round 38's call 1 found the unfused tensor-core attention 6-31% faster than the
# fused kernel after 8k-token prompts and 7-11% at batch 16 after 512.
# 1. graph_check with both (--fused-long-ctx 100: its prompts of 5-205 tokens cross 100 as
#    they decode; --fused-max-rows 8: the 9-16-row buckets unfused) against eager steps that
#    choose alike;
# 2. decode rows default / --fused-long-ctx 0 (every step unfused) after 512, 2k, 4k, 8k and
#    32k tokens at batches 1-16 (0.6B) and 1-16 (1.7B at 512 and 8k); --fused-max-rows 8;
# 3. the batch-1 and batch-8 op profile of the defaults (the norm launches of 3-8-row steps).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1500 --fused-long-ctx 100 \
  --fused-max-rows 8 > "$OUT/gc.log" 2>&1
echo "== gc long+rows rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|engine|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-160 | head -14
for p in 512 2000 4000 8000; do
  for v in "" "--fused-long-ctx 0"; do
    row "0.6b p$p [$v]" --model-dir /tmp/m-0.6b --prompt $p --batches 1,2,4,8,16 --new 64 $v
  done
done
row "0.6b p512 [--fused-max-rows 8]" --model-dir /tmp/m-0.6b --batches 8,16 --new 64 --fused-max-rows 8
for p in 512 8000; do
  for v in "" "--fused-long-ctx 0"; do
    row "1.7b p$p [$v]" --model-dir /tmp/m-1.7b --prompt $p --batches 1,4,8,16 --new 64 $v
  done
done
for v in "" "--fused-long-ctx 0"; do
  row "0.6b p32000 [$v]" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1,4 --new 32 $v
done
left 480 && { timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,8 > "$OUT/prof.log" 2>&1
  echo "== profile rc $? t=$((SECONDS - T0))"; grep -vE "^\s*$" "$OUT/prof.log" | tail -40 | cut -c1-150; }
echo "done t=$((SECONDS - T0))"
