#!/usr/bin/env bash
# On the GPU machine, call 1 of the next round (#21): two loop variants of the fused decode
# attention built in round 32 without a GPU (off by default): 8 tokens a half-warp in flight
# (--fused-fetch8 2) and two rounds of 4 pipelined in two register sets (--fused-pipelined 2),
# for the 1-2-row graphs, whose partitions walk ~500-1,000 tokens at 32k. kernel_check
# --model-only first (every fused case with both, tolerance 0 where exact), then decode at 512,
# 8k and 32k tokens of context, batches 1 and 2, 0.6B and 1.7B (two runs each at 512).
# Call 2: scripts/gpu_call_round33b.sh.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model
timeout 200 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
echo "== kc rc $?"; grep -E "^kernel-check|FAILED|Error|panic" "$OUT/kc.log" | head -8
for s in 0.6b 1.7b; do for p in 512 8000 32000; do
  vs=("" "--fused-fetch8 2" "--fused-pipelined 2")
  [ "$p" = 512 ] && vs+=("${vs[@]}")   # two runs where the differences are small
  for v in "${vs[@]}"; do
    timeout 60 .gpu/bench --model-dir /tmp/m-$s --no-peer --prompt $p --batches 1,2 --new 64 $v > "$OUT/b.log" 2>&1
    echo "== $s p$p ${v:-default} rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/; prefill.*//; s/ours decode batch //' | paste -sd' '
  done
done; done
