#!/usr/bin/env bash
# On the GPU machine, round 40's call 3 (#21): the fused MLP (--mlp-fused) in its one form
# (clusters of 16, sums stored into the summing rank, two blocks an SM) with the next norm +
# qkv staging the partials in shared memory by cp.async (pnorm_gemv_*, 64 registers: four
# blocks an SM, one wave of qkv; at 74 registers it took two). Checks, the ops alone, rows at
# batches 1-2 after 512-token prompts (three runs, default / fused), after 2k and 8k.
# Ran on commit 94934ca's binaries; --mlp-fused and its kernels were removed after call 4 (slower;
# BENCHMARKS.md), so this script needs that commit.
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
kc kc-mlp 150 --gemv-only --model-dir /tmp/m-0.6b --mlp-fused
grep -E "^mlp fused|decode [12] row" "$OUT/kc-mlp.log" | cut -c1-100
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --mlp-fused > "$OUT/gc.log" 2>&1
echo "== gc mlp-fused rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,2 --mlp-fused > "$OUT/prof.log" 2>&1
echo "== profile rc $? t=$((SECONDS - T0))"
grep -E "^## batch [12]: one|MLP|norm\+qkv|add\+norm|down \(ours\)|graph_pdl 1" "$OUT/prof.log" | cut -c1-150
for r in 1 2 3; do
  for v in "" "--mlp-fused"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
  done
done
for p in 2048 8192; do
  for v in "" "--mlp-fused"; do
    row "0.6b p$p [$v]" --model-dir /tmp/m-0.6b --prompt $p --batches 1,2 --new 64 $v
  done
done
echo "done t=$((SECONDS - T0))"
