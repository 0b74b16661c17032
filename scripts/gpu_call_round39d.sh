#!/usr/bin/env bash
# On the GPU machine, round 39's call 4 (#21): the committed defaults (the presummed norm on,
# the unfused attention past 2,048 / 6,144 tokens and above 8 rows): every check, then the
# floors' rows and the long-context rows; the unfused attention past 512 tokens for 2+ rows
# after 1k-token prompts (where the default bound of 2,048 keeps them fused).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
kc kc-gemv 150 --model-dir /tmp/m-0.6b --gemv-only
kc kc-model 120 --model-dir /tmp/m-mix --model-only
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1500 > "$OUT/gc.log" 2>&1
echo "== gc defaults rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for r in 1 2; do
  row "0.6b p512 run $r" --model-dir /tmp/m-0.6b --batches 1,2,3,4,8,16 --new 128
  row "1.7b p512 run $r" --model-dir /tmp/m-1.7b --batches 1,8,16 --new 128
done
row "0.6b p8000" --model-dir /tmp/m-0.6b --prompt 8000 --batches 1,2,4,8,16 --new 64
row "1.7b p8000" --model-dir /tmp/m-1.7b --prompt 8000 --batches 1,4,8,16 --new 64
for v in "" "--fused-long-ctx 512"; do
  row "0.6b p1000 [$v]" --model-dir /tmp/m-0.6b --prompt 1000 --batches 2,4,8 --new 64 $v
done
row "0.6b p32000" --model-dir /tmp/m-0.6b --prompt 32000 --batches 1,4 --new 32
echo "done t=$((SECONDS - T0))"
