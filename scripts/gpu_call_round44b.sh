#!/usr/bin/env bash
# Round 44, call 2: the qkv matmul inside the fused attention with its weights in registers
# (1,024 inputs a row) and shared memory (the rest), two blocks an SM: graph_check --qkv-check
# on 0.6B and 1.7B (bits against the qkv launch), then batch 1 after 512 / 2k-token prompts
# with and without --attn-qkv (gemv_tma now on by default), two interleaved runs; then
# graph_check (1,000 stress steps) on the new defaults.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
for s in 0.6b 1.7b; do
  RUST_LOG=policy_serve=info timeout 150 .gpu/graph_check --model-dir /tmp/m-$s --qkv-check \
    > "$OUT/qkv-$s.log" 2>&1
  echo "== qkv-check $s rc $? t=$((SECONDS - T0))"
  grep -E "attn_qkv|qkv check|^\||graph-check|Error|panic" "$OUT/qkv-$s.log" | cut -c60-260 | head -16
done
for r in 1 2; do
  for v in "" "--attn-qkv"; do
    row "0.6b p512 b1 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 $v
    row "1.7b p512 b1 [$v] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 $v
  done
done
for v in "" "--attn-qkv"; do
  row "0.6b p2k b1 [$v]" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1 --new 128 $v
  row "0.6b p4k b1 [$v]" --model-dir /tmp/m-0.6b --prompt 4000 --batches 1 --new 128 $v
done
row "0.6b p512 b8 []" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128
left 420 && { timeout 170 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1000 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
