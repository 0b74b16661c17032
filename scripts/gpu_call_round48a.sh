#!/usr/bin/env bash
# Round 48, call 1 (#21): what rounds 46-47 built for the dense floors and never ran, as bench
# sweeps (`bench --variant`: every variant's engine in one process, two rounds interleaved, each
# row naming whether its greedy tokens equal the defaults'). It replaces gpu_call_round46.sh,
# 46b.sh and 47b.sh (their rows, their checks) at about half their device time: one process, one
# CUDA context and one logits check a sweep instead of one a row. In priority order (each step
# skipped once `left` says the call's time is short):
#  1. 0.6B batches 1 and 8 after 512-token prompts: the attention's L2 prefetch of the next
#     weights at 4 / 16 / 22 / 30 MiB and early at 22; its K/V prefetch at 64 / 128 / 256 tokens,
#     128 with 22 MiB, 256 with batch 8 in 4 partitions; clusters of 8; the older --l2-prefetch;
#     the deep 3-8-row down.
#  2. 1.7B batches 1 and 8: the weight prefetch at 8 / 20 / 32 / 44 MiB and early at 32, the K/V
#     prefetch at 128, clusters of 8, --l2-prefetch, the deep down.
#  3. kernel_check --gemv-only: the deep down's bits (deep_bits) against the default.
#  4. 0.6B batches 3 / 4 / 8 with the deep down.
#  5. graph_check stress with every #21 variant on at once.
#  6. 0.6B after 8k-token prompts: the K/V prefetch at 128 and 512 tokens.
#  7. The chain map (graph_check --profile-skip) of each variant's ops at batches 1 and 8.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
B="--prompt 512 --batches 1,8 --new 128"
sweep 06b 230 "--model-dir /tmp/m-0.6b $B" "" \
  "--attn-l2-prefetch 4" "--attn-l2-prefetch 16" "--attn-l2-prefetch 22" "--attn-l2-prefetch 30" \
  "--attn-l2-prefetch 22 --attn-l2-prefetch-early" \
  "--attn-kv-prefetch 64" "--attn-kv-prefetch 128" "--attn-kv-prefetch 256" \
  "--attn-kv-prefetch 128 --attn-l2-prefetch 22" "--attn-kv-prefetch 256 --graph-splits-mid 4" \
  "--fused-cluster-few 8" "--l2-prefetch" "--mma-res-deep"
sweep 17b 200 "--model-dir /tmp/m-1.7b $B" "" \
  "--attn-l2-prefetch 8" "--attn-l2-prefetch 20" "--attn-l2-prefetch 32" "--attn-l2-prefetch 44" \
  "--attn-l2-prefetch 32 --attn-l2-prefetch-early" "--attn-kv-prefetch 128" \
  "--fused-cluster-few 8" "--l2-prefetch" "--mma-res-deep"
left 480 && {
  kc gemv 120 --model-dir /tmp/m-0.6b --gemv-only
  echo "deep checks: $(grep -c "presum deep" "$OUT/gemv.log"), failed: $(grep "presum deep" "$OUT/gemv.log" | grep -c FAIL)"
}
sweep 06b-b348 60 "--model-dir /tmp/m-0.6b --prompt 512 --batches 3,4,8 --new 128" "" "--mma-res-deep"
left 470 && { timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 400 --attn-kv-prefetch 128 \
  --attn-l2-prefetch 22 --fused-cluster-few 8 --mma-res-deep > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
sweep 06b-8k 70 "--model-dir /tmp/m-0.6b --prompt 8000 --batches 1,8 --new 64 --variant-rounds 1" "" \
  "--attn-kv-prefetch 128" "--attn-kv-prefetch 512"
i=0
for v in "" "--attn-l2-prefetch 22" "--attn-kv-prefetch 128" "--fused-cluster-few 8" "--mma-res-deep"; do
  left 560 || break
  i=$((i + 1))
  timeout 40 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,8 --profile-skip 2,4,8,16 $v > "$OUT/skip$i.log" 2>&1
  echo "== 0.6b profile-skip [$v] rc $? t=$((SECONDS - T0))"
  grep -E "^\| (o_proj|down) \(ours|^batch .* graph_pdl (1|1, without)" "$OUT/skip$i.log" \
    | sed 's/ back to back//; s/; with argmax.*//' | cut -c1-160
done
echo "done t=$((SECONDS - T0))"
