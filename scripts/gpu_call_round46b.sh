#!/usr/bin/env bash
# Round 46, call 4 (NOT RUN in round 46; after scripts/gpu_call_round46.sh, same binaries):
# each fused decode attention block prefetching its partition's first TOKENS tokens of K/V
# into L2 before its wait (--attn-kv-prefetch TOKENS, off by default; the chain map put batch
# 8's attention at 14.9 us a layer in the chain against 11.1 alone with its K/V in L2), and
# 1-4-row steps in clusters of 8 instead of 16 (--fused-cluster-few 8: 8 partitions of 64
# tokens a KV head after 512-token prompts, a merge of 8 partials). kernel_check --model-only
# on the mixed MoE model with both prefetches (the fused cases once more on l2_kernels and at
# cluster 8), bench rows beside the default (two interleaved runs): 0.6B batches 1 and 8
# after 512-token prompts at 64 / 128 / 256 tokens, 128 with --attn-l2-prefetch 22,
# --attn-l2-prefetch 30 alone (22 MiB: o, gate|up, down; 30: the next layer's qkv too),
# batch 8 in 4 partitions with 256 tokens prefetched (longer partitions may pay once their
# later rounds read L2), the older --l2-prefetch (each matmul prefetching the next one's
# weights; 2-10% slower when last measured, on older kernels), cluster 8; after 8k-token
# prompts (partitions past L2's room?) at 128 and 512; 1.7B batches 1 and 8 at 128, the
# older --l2-prefetch, cluster 8; graph_check stress with the prefetches and cluster 8.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
kc kcm 150 --model-only --model-dir /tmp/m-mix --attn-kv-prefetch 128 --attn-l2-prefetch 16
echo "l2 prefetch checks: $(grep -c "l2 prefetch" "$OUT/kcm.log"), failed: $(grep "l2 prefetch" "$OUT/kcm.log" | grep -c FAIL)"
B="--prompt 512 --batches 1,8 --new 128"
for r in 1 2; do
  row "0.6b [] run $r" --model-dir /tmp/m-0.6b $B
  for t in 64 128 256; do row "0.6b [kv $t] run $r" --model-dir /tmp/m-0.6b $B --attn-kv-prefetch $t; done
  row "0.6b [kv 128, l2 22] run $r" --model-dir /tmp/m-0.6b $B --attn-kv-prefetch 128 --attn-l2-prefetch 22
  row "0.6b [l2 30] run $r" --model-dir /tmp/m-0.6b $B --attn-l2-prefetch 30
  row "0.6b [--l2-prefetch] run $r" --model-dir /tmp/m-0.6b $B --l2-prefetch
  row "0.6b [kv 256, mid 4] run $r" --model-dir /tmp/m-0.6b $B --attn-kv-prefetch 256 --graph-splits-mid 4
  row "0.6b [cluster 8] run $r" --model-dir /tmp/m-0.6b $B --fused-cluster-few 8
done
L="--prompt 8000 --batches 1,8 --new 64"
row "0.6b 8k [] run 1" --model-dir /tmp/m-0.6b $L
for t in 128 512; do row "0.6b 8k [kv $t] run 1" --model-dir /tmp/m-0.6b $L --attn-kv-prefetch $t; done
for r in 1 2; do
  row "1.7b [] run $r" --model-dir /tmp/m-1.7b $B
  row "1.7b [kv 128] run $r" --model-dir /tmp/m-1.7b $B --attn-kv-prefetch 128
  row "1.7b [--l2-prefetch] run $r" --model-dir /tmp/m-1.7b $B --l2-prefetch
  row "1.7b [cluster 8] run $r" --model-dir /tmp/m-1.7b $B --fused-cluster-few 8
done
# The attention's share of the chain with each (mask 2), beside the default's.
for v in "" "--attn-kv-prefetch 128" "--fused-cluster-few 8"; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,8 --profile-skip 2 $v > "$OUT/skip2.log" 2>&1
  echo "== 0.6b profile-skip 2 [$v] rc $? t=$((SECONDS - T0))"
  grep -E "^batch .* graph_pdl (1|1, without)" "$OUT/skip2.log" | sed 's/ back to back//; s/; with argmax.*//'
done
left 420 && { timeout 170 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --attn-kv-prefetch 128 \
  --attn-l2-prefetch 22 --fused-cluster-few 8 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
