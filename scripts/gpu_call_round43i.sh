#!/usr/bin/env bash
# Round 43, call 9: the 1-row down on the streamed matmul (--gemv-tma N, off by default):
# kernel_check --gemv-only (its bits against gemv.cu's), then batch 1 after 512-token prompts
# on both shapes, 4 and 8 pieces a warp beside the default, two interleaved runs.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 100 --gemv-only   # (as run: without --model-dir, so kernel_check refused to start)
grep -E "gemv_tma" "$OUT/gemv.log" | grep -c "" ; grep -E "gemv_tma.*FAIL" "$OUT/gemv.log" | head -5
for r in 1 2; do
  for m in 1.7b 0.6b; do
    for v in "" "--gemv-tma 4" "--gemv-tma 8"; do
      row "$m p512 b1 [$v] run $r" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 $v
    done
  done
done
timeout 60 .gpu/graph_check --model-dir /tmp/m-1.7b --profile 1 --gemv-tma 4 > "$OUT/prof.log" 2>&1
echo "== profile 1.7b tma rc $?: $(grep -E "down|graph_pdl 1: graph replay" "$OUT/prof.log" | cut -c1-90 | paste -sd' ')"
timeout 60 .gpu/graph_check --model-dir /tmp/m-1.7b --profile 1 > "$OUT/prof0.log" 2>&1
echo "== profile 1.7b default rc $?: $(grep -E "down|graph_pdl 1: graph replay" "$OUT/prof0.log" | cut -c1-90 | paste -sd' ')"
echo "done t=$((SECONDS - T0))"
