#!/usr/bin/env bash
# On the GPU machine, the next call (#21), three variants built in round 32 without a GPU (all
# off by default): eager decode steps cut the attention in at most their graph bucket's
# partitions (--eager-graph-splits); the fused attention with 8 tokens a half-warp in flight
# (--fused-fetch8 1) or two rounds of 4 pipelined (--fused-pipelined 1) for the 1-row graph,
# whose partitions walk ~500 tokens at 32k. First kernel_check --model-only (every fused case with
# both loop variants, tolerance 0 where exact), then the rows below. Decode at 8k and 32k tokens of context, batches 1 and 4, graphs and eager
# (--compare-eager: its eager rows are the ones the option changes), with and without it; a
# mixed step's decode rows (bench --mixed: 8 streams decoding while a 32k prompt prefills);
# graph_check with it (the graph and eager steps then cut every context alike).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model
timeout 200 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
echo "== kc rc $?"; grep -E "^kernel-check|FAILED|Error|panic" "$OUT/kc.log" | head -8
for s in 0.6b 1.7b; do for p in 512 8000 32000; do
  for v in "" "--fused-fetch8 1" "--fused-pipelined 1" "" "--fused-fetch8 1" "--fused-pipelined 1"; do
    timeout 60 .gpu/bench --model-dir /tmp/m-$s --no-peer --prompt $p --batches 1 --new 64 $v > "$OUT/b.log" 2>&1
    echo "== $s p$p ${v:-default} rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/; prefill.*//; s/ours decode batch //'
  done
done; done
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
