#!/usr/bin/env bash
# Round 44, call 3: the qkv phase with every load of its norm issued at once (the norm weights
# before the wait) and only for contexts one cluster holds (the tensor-core loop): graph_check
# --qkv-check on 0.6B and 1.7B, then batch 1 after 512 / 1.5k-token prompts with and without
# --attn-qkv, two interleaved runs; the 1-row graph's replay by op (graph_check --profile 1).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
for s in 0.6b 1.7b; do
  RUST_LOG=policy_serve=info timeout 150 .gpu/graph_check --model-dir /tmp/m-$s --qkv-check \
    > "$OUT/qkv-$s.log" 2>&1
  echo "== qkv-check $s rc $? t=$((SECONDS - T0))"
  grep -E "attn_qkv|qkv check|^\| [0-9]|graph-check|Error|panic" "$OUT/qkv-$s.log" | cut -c60-260 | head -16
done
for r in 1 2; do
  for v in "" "--attn-qkv"; do
    row "0.6b p512 b1 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 $v
    row "1.7b p512 b1 [$v] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 $v
  done
done
for v in "" "--attn-qkv"; do
  row "0.6b p1.5k b1 [$v]" --model-dir /tmp/m-0.6b --prompt 1500 --batches 1 --new 128 $v
  row "0.6b p4k b1 [$v]" --model-dir /tmp/m-0.6b --prompt 4000 --batches 1 --new 128 $v
done
for v in "" "--attn-qkv"; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1 $v > "$OUT/prof$v.log" 2>&1
  echo "== profile [$v] rc $? t=$((SECONDS - T0))"; grep -E "replay|attention|qkv" "$OUT/prof$v.log" | cut -c1-160 | head -6
done
echo "done t=$((SECONDS - T0))"
