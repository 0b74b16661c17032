#!/usr/bin/env bash
# On the GPU machine, call 1 of the next round (#21), not yet run: KernelOptions::fused_long_ctx
# (--fused-long-ctx N: decode steps whose longest context passes N tokens run the attention
# unfused on tensor cores, graphs captured a second time for them), built after round 38's
# call 1 found the unfused tensor-core attention 6-31% faster than the fused kernel after 8k.
# 1. graph_check with --fused-long-ctx 100 (its prompts of 5-205 tokens cross 100 as they
#    decode: the unfused graphs and the fused ones against eager steps that choose alike) and
#    the defaults' kernel_check --model-only;
# 2. decode rows default / --fused-long-ctx 2048 / 4096 after 2k, 4k, 8k, 32k tokens at batches
#    1-16, and after 512 with --fused-long-ctx 0 (every step unfused: the fused bound at 16 rows).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1500 --fused-long-ctx 100 > "$OUT/gc.log" 2>&1
echo "== gc long rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-160 | head -12
kc kc 120 --model-dir /tmp/m-mix --model-only
for p in 4000 8000; do
  for v in "" "--fused-long-ctx 2048" "--fused-long-ctx 4096"; do
    row "0.6b p$p [$v]" --model-dir /tmp/m-0.6b --prompt $p --batches 1,2,4,8,16 --new 64 $v
  done
done
for v in "" "--fused-long-ctx 2048"; do
  row "1.7b p8000 [$v]" --model-dir /tmp/m-1.7b --prompt 8000 --batches 1,4,8 --new 64 $v
  row "0.6b p32000 [$v]" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1,4 --new 32 $v
done
for v in "" "--fused-long-ctx 0"; do
  row "0.6b p512 [$v]" --model-dir /tmp/m-0.6b --batches 1,2,4,8,16 $v
  row "1.7b p512 [$v]" --model-dir /tmp/m-1.7b --batches 1,4,8,16 $v
done
echo "done t=$((SECONDS - T0))"
