#!/usr/bin/env bash
# On the GPU machine, round 40's call 1 (#21): KernelOptions::mlp_fused (the MLP of 1-2-row
# decode steps in one launch, down split over the intermediate channels, each cluster's partial
# summed by the next layer's norm + qkv; off by default). kernel_check --gemv-only with it
# (the fused MLP against the three launches it replaces, clusters of 8 and 16; the model's 1-
# and 2-row steps against candle; greedy tokens), graph_check with it, then 0.6B rows after
# 512-token prompts at batches 1, 2 (and 8: not served) default / --mlp-fused 8 / 16, two runs.
# Ran on commit 06e2e79's binaries; --mlp-fused and its kernels were removed after call 4 (slower;
# BENCHMARKS.md), so this script needs that commit.
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
kc kc-mlp 150 --gemv-only --model-dir /tmp/m-0.6b --mlp-fused 16
grep -E "^mlp fused" "$OUT/kc-mlp.log" | cut -c1-110
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --mlp-fused 16 > "$OUT/gc.log" 2>&1
echo "== gc mlp-fused 16 rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for r in 1 2; do
  for v in "" "--mlp-fused 8" "--mlp-fused 16"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 $v
  done
done
row "0.6b p8k [--mlp-fused 16]" --model-dir /tmp/m-0.6b --prompt 8192 --batches 1,2 --new 64 --mlp-fused 16
row "0.6b p8k []" --model-dir /tmp/m-0.6b --prompt 8192 --batches 1,2 --new 64
echo "done t=$((SECONDS - T0))"
