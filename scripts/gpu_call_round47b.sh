#!/usr/bin/env bash
# Round 47, call 2 (#21; after gpu_call_round47.sh, same binaries; the first to drop if the
# session's device time runs short): the presummed norm's residual-adding matmul (o, down of
# 3-8-row steps) with 12 steps a warp in flight on weights of more than 2,048 inputs
# (--mma-res-deep, off by default): 0.6B's down in one round of loads, all before its wait,
# instead of two; 1.7B's in two instead of three. Round 46's chain map had batch 8's down at
# 6.5 us a layer against o's 4.8 on two thirds of the bytes. kernel_check --gemv-only
# (presum.rs deep_bits: bit for bit against the default kernel, and that the deep kernel
# serves), the batch-8 ops and down's share of the chain both ways (--profile-skip 16),
# batches 3, 4 and 8 after 512-token prompts on 0.6B and batch 8 on 1.7B beside the default
# (two interleaved runs), graph_check stress with it.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 160 --model-dir /tmp/m-0.6b --gemv-only
echo "deep checks: $(grep -c "presum deep" "$OUT/gemv.log"), failed: $(grep "presum deep" "$OUT/gemv.log" | grep -c FAIL)"
for f in "" "--mma-res-deep"; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 8 --profile-skip 16 $f > "$OUT/prof8.log" 2>&1
  echo "== profile 8 [$f] rc $?"
  grep -E "^\| (o_proj|down) \(ours|^batch .* graph_pdl (8|8, without)" "$OUT/prof8.log" | sed 's/ back to back//; s/; with argmax.*//' | cut -c1-160 | head -6
done
B="--prompt 512 --batches 3,4,8 --new 128"
for r in 1 2; do
  row "0.6b [] run $r" --model-dir /tmp/m-0.6b $B
  row "0.6b [deep] run $r" --model-dir /tmp/m-0.6b $B --mma-res-deep
done
for r in 1 2; do
  row "1.7b b8 [] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 8 --new 128
  row "1.7b b8 [deep] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 8 --new 128 --mma-res-deep
done
left 400 && { timeout 170 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --mma-res-deep > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
