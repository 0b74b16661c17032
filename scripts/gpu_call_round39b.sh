#!/usr/bin/env bash
# On the GPU machine, round 39's call 2 (#21): the presummed norm of 3-8-row steps
# (KernelOptions::norm_presum, --norm-presum, off: o and down add their output to the residual
# and sum its squares, gate|up and qkv normalize as they load; two launches a layer fewer),
# and the new defaults of call 1 (the unfused attention past 2,048 tokens for 2+ rows, 6,144
# for one, and above 8 rows).
# 1. kernel_check --gemv-only with --norm-presum (the kernels against the norm launch's path,
#    the model's 8-row step against the candle path, greedy tokens); graph_check with the
#    long-context bounds low enough to cross (100 / 150), and with --norm-presum;
# 2. decode rows: --norm-presum against the default at batches 3, 4, 8 (0.6B; two runs);
#    the new defaults against the old (--no-fused-long-ctx --fused-max-rows 16) after 1k, 6k
#    (0.6B) and 2k, 4k (1.7B) tokens; the MoE shape's rows on the defaults.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc kc-presum 150 --model-dir /tmp/m-0.6b --gemv-only --norm-presum
grep -E "^presum" "$OUT/kc-presum.log" | sort -k5 -g | tail -3 | cut -c1-120
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1000 --fused-long-ctx 100 \
  --fused-long-ctx-one 150 > "$OUT/gc.log" 2>&1
echo "== gc long rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1000 --norm-presum > "$OUT/gcp.log" 2>&1
echo "== gc presum rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gcp.log" | cut -c1-140 | head -8
for r in 1 2; do
  for v in "" "--norm-presum"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --batches 3,4,8 --new 128 $v
  done
done
row "1.7b p512 [--norm-presum]" --model-dir /tmp/m-1.7b --batches 8 --new 128 --norm-presum
old="--no-fused-long-ctx --fused-max-rows 16"
for v in "" "$old"; do
  row "0.6b p1000 [$v]" --model-dir /tmp/m-0.6b --prompt 1000 --batches 1,2,4,8,12,16 --new 64 $v
  row "0.6b p6000 [$v]" --model-dir /tmp/m-0.6b --prompt 6000 --batches 1,2 --new 64 $v
  row "1.7b p2000 [$v]" --model-dir /tmp/m-1.7b --prompt 2000 --batches 1,2,4,8,16 --new 64 $v
  row "1.7b p4000 [$v]" --model-dir /tmp/m-1.7b --prompt 4000 --batches 1,2,4,8,16 --new 64 $v
done
left 420 && { moe_model 4; row "moe4 p256" --model-dir /tmp/m-moe4 --prompt 256 --batches 1,2,8,16 --new 64; }
echo "done t=$((SECONDS - T0))"
