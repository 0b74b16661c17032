#!/usr/bin/env bash
# Round 42, call 2: qkv (--gemv-stream-norm) and o / down (--gemv-stream-plain) on streamed
# rows, off by default: kernel_check --gemv-only (the streamed kernels bit for bit against a
# block per eight rows), graph_check with both, the batch-1 op table and graph replay by
# variant, then batches 1-2 interleaved on both shapes.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc kc-gemv 170 --gemv-only --model-dir /tmp/m-0.6b --gemv-stream-norm --gemv-stream-plain
grep -E "streamed" "$OUT/kc-gemv.log" | grep -c " ok$" | sed 's/^/streamed ok lines: /'
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 --gemv-stream-norm --gemv-stream-plain > "$OUT/gc.log" 2>&1
echo "== gc rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
V=("" "--gemv-stream-norm" "--gemv-stream-plain" "--gemv-stream-norm --gemv-stream-plain")
for m in 0.6b 1.7b; do
  for v in "${V[@]}"; do
    timeout 60 .gpu/graph_check --model-dir /tmp/m-$m --profile 1 $v > "$OUT/prof.log" 2>&1
    echo "== profile $m [$v] rc $?: $(grep -E "norm\+qkv|^\| o|^\| down|sum of ops|graph_pdl 1: graph replay" "$OUT/prof.log" | cut -c1-90 | paste -sd' ')"
  done
done
for r in 1 2; do
  for v in "${V[@]}"; do
    row "0.6b p512 b1,2 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
  done
done
for r in 1 2; do
  for v in "${V[@]}"; do
    row "1.7b p512 b1,2 [$v] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1,2 --new 128 $v
  done
done
for v in "${V[@]}"; do
  row "0.6b p2k b1,2 [$v]" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1,2 --new 128 $v
done
echo "done t=$((SECONDS - T0))"
