#!/usr/bin/env bash
# On the GPU machine, call 5 of round 32 (#21): the 1-row graph bucket's decode-attention
# partitions (--graph-splits-one N; default 32) at 64 and 128, batch 1, at 8k and 32k tokens of
# context and at the decode rows' 512, 0.6B and 1.7B. (Call 4, 128 / rows for 1-2 rows: batch 1
# +41-45% at 32k, batch 2 -24%..0: 1,024 blocks are past one wave of ~660; 512 is the count
# 2 rows x 32 partitions has.)
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b
for s in 0.6b 1.7b; do for p in 8000 32000; do for v in "" "--graph-splits-one 64" "--graph-splits-one 128"; do
  timeout 60 .gpu/bench --model-dir /tmp/m-$s --no-peer --prompt $p --batches 1 --new 64 $v > "$OUT/b.log" 2>&1
  echo "== $s p$p ${v:-default} rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/; prefill.*//; s/ours decode batch //'
done; done; done
for s in 0.6b 1.7b; do for v in "" "--graph-splits-one 64" "--graph-splits-one 128" "" "--graph-splits-one 64" "--graph-splits-one 128"; do
  timeout 40 .gpu/bench --model-dir /tmp/m-$s --no-peer --batches 1 $v > "$OUT/b.log" 2>&1
  echo "== $s p512 ${v:-default} rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/; prefill.*//; s/ours decode batch //'
done; done
