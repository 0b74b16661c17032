#!/usr/bin/env bash
# Round 44, call 4: the qkv phase with its weights all in shared memory (--attn-qkv shared:
# 146 registers a thread against 242-255 with 1,024 inputs a row in registers, so its blocks
# may sit beside the down's before the wait): graph_check --qkv-check on 0.6B, then batch 1
# after 512-token prompts, default / shared / registers, two interleaved runs.
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
RUST_LOG=policy_serve=info timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --qkv-check \
  --attn-qkv shared > "$OUT/qkv-0.6b.log" 2>&1
echo "== qkv-check 0.6b shared rc $? t=$((SECONDS - T0))"
grep -E "attn_qkv|qkv check|^\| [0-9]|graph-check|Error|panic" "$OUT/qkv-0.6b.log" | cut -c60-260 | head -16
for r in 1 2; do
  for v in "" "--attn-qkv shared" "--attn-qkv registers"; do
    row "0.6b p512 b1 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 $v
  done
done
for v in "" "--attn-qkv shared"; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1 $v > "$OUT/prof${v// /}.log" 2>&1
  echo "== profile [$v] rc $? t=$((SECONDS - T0))"; grep -E "replay" "$OUT/prof${v// /}.log" | cut -c1-160 | head -3
done
echo "done t=$((SECONDS - T0))"
