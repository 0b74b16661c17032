#!/usr/bin/env bash
# On the GPU machine, round 40's call 4 (#21): the fused MLP's partials staged through L1
# (cp.async.ca; call 3's cp.async.cg read them from L2 in every block: 6.6 us alone). Checks,
# the ops alone, rows at batches 1-2 after 512 tokens (three runs) and after 8k.
# Ran on commit 4c09824's binaries; --mlp-fused and its kernels were removed after call 4 (slower;
# BENCHMARKS.md), so this script needs that commit.
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
kc kc-mlp 150 --gemv-only --model-dir /tmp/m-0.6b --mlp-fused
grep -E "^mlp fused|decode [12] row" "$OUT/kc-mlp.log" | grep -vE " ok$" | cut -c1-100
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,2 --mlp-fused > "$OUT/prof.log" 2>&1
echo "== profile rc $? t=$((SECONDS - T0))"
grep -E "^## batch [12]: one|MLP|norm\+qkv|add\+norm|graph_pdl 1" "$OUT/prof.log" | cut -c1-150
for r in 1 2 3; do
  for v in "" "--mlp-fused"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
  done
done
for v in "" "--mlp-fused"; do
  row "0.6b p8192 [$v]" --model-dir /tmp/m-0.6b --prompt 8192 --batches 1,2 --new 64 $v
done
echo "done t=$((SECONDS - T0))"
