#!/usr/bin/env bash
# On the GPU machine, call 4 of round 32 (#21): graph buckets of 1-2 rows with 128 / rows
# decode-attention partitions (--graph-splits-wide, off by default) against the 32 of the
# default, at the prompt lengths of the decode rows (512: the cost of the idle partitions) and
# of agents (8k, 32k: the gain), 0.6B and 1.7B; then graph_check with it on. (The flag of commit
# 4fa37e5; 8057cef replaced it with --graph-splits-one N, for the 1-row bucket only.)
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b
for s in 0.6b 1.7b; do for v in "" "--graph-splits-wide" "" "--graph-splits-wide"; do
  timeout 90 .gpu/bench --model-dir /tmp/m-$s --no-peer --batches 1,2 $v > "$OUT/b.log" 2>&1
  echo "== $s p512 ${v:-default} rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done
for s in 0.6b 1.7b; do for p in 8000 32000; do for v in "" "--graph-splits-wide"; do
  timeout 120 .gpu/bench --model-dir /tmp/m-$s --no-peer --prompt $p --batches 1,2 --new 64 $v > "$OUT/b.log" 2>&1
  echo "== $s p$p ${v:-default} rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/; prefill.*//; s/ours decode batch //' | paste -sd' '
done; done; done
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --graph-splits-wide > "$OUT/gc.log" 2>&1
echo "== gc wide rc $?"; grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-200 | head -12
