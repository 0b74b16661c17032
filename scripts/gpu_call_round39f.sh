#!/usr/bin/env bash
# On the GPU machine, round 39's call 6 (#21): KernelOptions::fused_long_ctx_many (steps of 5+
# rows past 1,024 tokens of context run the attention unfused; on by default, built after call
# 4 found every step of 2+ rows unfused past 512 tokens +4.8% at batch 8 after 1k-token prompts
# and -5% at batch 2). graph_check with the three bounds low enough to cross (100 / 150 / 60);
# rows after 1.2k tokens at batches 5, 6, 8 default against the old bound
# (--fused-long-ctx-many 2048), and after 700 (under the bound: unchanged).
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 800 --fused-long-ctx 100 \
  --fused-long-ctx-one 150 --fused-long-ctx-many 60 > "$OUT/gc.log" 2>&1
echo "== gc bounds rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for r in 1 2; do
  for v in "" "--fused-long-ctx-many 2048"; do
    row "0.6b p1200 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 1200 --batches 5,6,8 --new 64 $v
  done
done
row "0.6b p700" --model-dir /tmp/m-0.6b --prompt 700 --batches 5,8 --new 64
echo "done t=$((SECONDS - T0))"
