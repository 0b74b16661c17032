#!/usr/bin/env bash
# Round 44, call 1: (a) the streamed 1-row matmul's bit check (kernel_check --gemv-only's
# tma_bits) left from round 43; (b) the qkv matmul inside the fused attention (--attn-qkv):
# graph_check --qkv-check (bits against the qkv launch, eager and on graphs, 5-4,000-token
# prompts) on 0.6B and 1.7B; (c) batch 1 after 512-token prompts, default / --attn-qkv /
# --gemv-tma 4 / both, two interleaved runs, and 1.7B.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
tma_bits
for s in 0.6b 1.7b; do
  RUST_LOG=policy_serve=info timeout 150 .gpu/graph_check --model-dir /tmp/m-$s --qkv-check \
    > "$OUT/qkv-$s.log" 2>&1
  echo "== qkv-check $s rc $? t=$((SECONDS - T0))"
  grep -E "attn_qkv|qkv check|^\||graph-check|Error|panic" "$OUT/qkv-$s.log" | cut -c1-200 | head -16
done
for r in 1 2; do
  for v in "" "--attn-qkv" "--gemv-tma 4" "--attn-qkv --gemv-tma 4"; do
    row "0.6b p512 b1 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 $v
  done
  for v in "" "--attn-qkv"; do
    row "1.7b p512 b1 [$v] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 $v
  done
done
row "0.6b p2k b1 []" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1 --new 128
row "0.6b p2k b1 [--attn-qkv]" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1 --new 128 --attn-qkv
echo "done t=$((SECONDS - T0))"
