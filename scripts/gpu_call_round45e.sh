#!/usr/bin/env bash
# Round 45, call 5 (NOT RUN in round 45: no device was lent after call 2): the greedy tokens
# computed inside the decode graphs (--graph-argmax: the f32 logits' launch also takes each
# row's argmax, and an all-greedy step with unedited logits takes those tokens instead of
# launching the argmax after the graph), off by default. kernel_check --gemv-only (greedy.rs:
# the logits bit for bit and the same tokens as to_f32 then argmax), graph_check with it
# (graphs against eager steps token for token, pipelined, stress), batches 1 and 8 after
# 512-token prompts on 0.6B and batch 1 on 1.7B beside the default, two interleaved runs.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 160 --model-dir /tmp/m-0.6b --gemv-only
echo "greedy checks: $(grep -c "to_f32_argmax" "$OUT/gemv.log"), failed: $(grep "to_f32_argmax" "$OUT/gemv.log" | grep -c FAIL)"
for r in 1 2; do
  row "0.6b [] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128
  row "0.6b [graph-argmax] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128 --graph-argmax
  row "1.7b [] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128
  row "1.7b [graph-argmax] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 --graph-argmax
done
left 400 && { timeout 170 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --graph-argmax > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
