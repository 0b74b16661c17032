#!/usr/bin/env bash
# Round 41, call 6: the final code (the o fold removed; fused_mma_one on by default):
# kernel_check --model-only and graph_check on the defaults, then the floor rows (0.6B and
# 1.7B at batches 1, 8 after 512-token prompts; 0.6B batch 8 first on a fresh engine) and the
# 30B-A3B shape's batch 1 on 4 of 48 layers.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; moe_model 4; echo "models t=$((SECONDS - T0))"
kc kc-model 150 --model-only --model-dir /tmp/m-mix
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 > "$OUT/gc.log" 2>&1
echo "== gc rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for r in 1 2; do
  row "0.6b p512 b8 run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 8 --new 128
  row "0.6b p512 b1,8 run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128
  row "1.7b p512 b1,8 run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128
  row "30b-a3b 4 layers p256 b1,2,8 run $r" --model-dir /tmp/m-moe4 --prompt 256 --batches 1,2,8 --new 64
done
echo "done t=$((SECONDS - T0))"
