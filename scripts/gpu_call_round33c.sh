#!/usr/bin/env bash
# On the GPU machine, call 3 of the next round (#21): the 3-4-row graphs in 16 decode-attention
# partitions instead of 32 (--graph-splits-few 16, off by default; built in round 32 without a
# GPU), batches 3 and 4 at 512, 8k and 32k tokens of context, 0.6B and 1.7B.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b
# The 3-4-row graphs in 16 partitions instead of 32 (--graph-splits-few 16, off by default):
# 384-512 blocks instead of 768-1,024 at 8 KV heads; batches 3 and 4 at 512, 8k and 32k.
for s in 0.6b 1.7b; do for p in 512 8000 32000; do for v in "" "--graph-splits-few 16"; do
  timeout 90 .gpu/bench --model-dir /tmp/m-$s --no-peer --prompt $p --batches 3,4 --new 64 $v > "$OUT/b.log" 2>&1
  echo "== $s p$p ${v:-default} rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/; prefill.*//; s/ours decode batch //' | paste -sd' '
done; done; done
