#!/usr/bin/env bash
# Round 44, call 8: the streamed 1-row matmul at 3 pieces a warp by default: kernel_check
# --gemv-only (tma_bits at 1, 3, 4 and 10 pieces), batch 1 and 8 after 512-token prompts on
# 0.6B (two runs) and 1.7B batch 1, graph_check with 1,000 stress steps on 0.6B.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
tma_bits
for r in 1 2; do
  row "0.6b p512 b1,8 [] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128
done
row "1.7b p512 b1 []" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128
left 420 && { timeout 170 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1000 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
