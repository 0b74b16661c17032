#!/usr/bin/env bash
# On the GPU machine, call 2 of the next round (#21): eager decode steps cut the attention in at
# most their graph bucket's partitions (--eager-graph-splits, off by default; built in round 32
# without a GPU). Decode at 8k and 32k tokens of context, batches 1 and 4, graphs and eager
# (--compare-eager: its eager rows are the ones the option changes), with and without it; a
# mixed step's decode rows (bench --mixed: 8 streams decoding while a 32k prompt prefills);
# graph_check with it (the graph and eager steps then cut every context alike).
# Call 3: scripts/gpu_call_round33c.sh.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b
for s in 0.6b 1.7b; do for p in 8000 32000; do for v in "" "--eager-graph-splits"; do
  timeout 200 .gpu/bench --model-dir /tmp/m-$s --no-peer --prompt $p --batches 1,4 --new 64 \
    --compare-eager $v > "$OUT/long-$s-$p.log" 2>&1
  echo "== $s prompt $p ${v:-default} rc $?"; grep -E "^ours(-eager)? decode|Error" "$OUT/long-$s-$p.log" | sed 's/; prefill.*//'
done; done; done
for v in "" "--eager-graph-splits"; do
  timeout 200 .gpu/bench --model-dir /tmp/m-0.6b --no-peer --prompt 32000 --mixed --batches 16 $v > "$OUT/mixed.log" 2>&1
  echo "== mixed ${v:-default} rc $?"; grep -E "^ours mixed|Error" "$OUT/mixed.log"
done
timeout 200 .gpu/graph_check --model-dir /tmp/m-0.6b --eager-graph-splits > "$OUT/gc.log" 2>&1
echo "== gc rc $?"; grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc.log" | cut -c1-200 | head -12
