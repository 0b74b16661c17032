#!/usr/bin/env bash
# Round 45, call 2 (binaries of call 1): the fused decode attention's tensor-core loop for
# steps of 3-8 rows whose contexts fit one cluster (--fused-mma-rows 4 / 8; the default
# takes it for 1-2 rows): batches 4 and 8 after 512-token prompts on 0.6B and 1.7B, beside the
# default, two interleaved runs; graph_check with --fused-mma-rows 8.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
B="--prompt 512 --batches 1,4,8 --new 128"
for r in 1 2; do
  row "0.6b [] run $r" --model-dir /tmp/m-0.6b $B
  row "0.6b [mma rows 4] run $r" --model-dir /tmp/m-0.6b $B --fused-mma-rows 4
  row "0.6b [mma rows 8] run $r" --model-dir /tmp/m-0.6b $B --fused-mma-rows 8
done
for r in 1 2; do
  row "1.7b [] run $r" --model-dir /tmp/m-1.7b $B
  row "1.7b [mma rows 8] run $r" --model-dir /tmp/m-1.7b $B --fused-mma-rows 8
done
row "0.6b p1000 [] " --model-dir /tmp/m-0.6b --prompt 1000 --batches 4,8 --new 24
row "0.6b p1000 [mma rows 8]" --model-dir /tmp/m-0.6b --prompt 1000 --batches 4,8 --new 24 --fused-mma-rows 8
left 400 && { timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 --fused-mma-rows 8 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
