#!/usr/bin/env bash
# Round 42, call 1: the attention's partials merged inside o (--attn-merge-o S, off by
# default): kernel_check --model-only with it (the merge_o cases bit for bit against the
# unfused tensor-core kernels + the plain matmul; the model-level checks on it), graph_check
# with it, the batch-1 graph replay by variant, then batches 1-2 interleaved on both shapes.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
kc kc-model 170 --model-only --model-dir /tmp/m-mix --attn-merge-o 8
grep -E "merge_o" "$OUT/kc-model.log" | grep -c " ok$" | sed 's/^/merge_o ok lines: /'
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 --attn-merge-o 8 > "$OUT/gc.log" 2>&1
echo "== gc rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for v in "" "--attn-merge-o 4" "--attn-merge-o 8" "--attn-merge-o 16"; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1 $v > "$OUT/prof.log" 2>&1
  echo "== profile [$v] rc $?: $(grep -iE "replay" "$OUT/prof.log" | head -3 | paste -sd' ' | cut -c1-200)"
done
for r in 1 2; do
  for v in "" "--attn-merge-o 4" "--attn-merge-o 8" "--attn-merge-o 16"; do
    row "0.6b p512 b1,2 [$v] run $r" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
  done
done
for r in 1 2; do
  for v in "" "--attn-merge-o 4" "--attn-merge-o 8"; do
    row "1.7b p512 b1,2 [$v] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1,2 --new 128 $v
  done
done
for v in "" "--attn-merge-o 4" "--attn-merge-o 8" "--attn-merge-o 16"; do
  row "0.6b p2k b1,2 [$v]" --model-dir /tmp/m-0.6b --prompt 2000 --batches 1,2 --new 128 $v
done
echo "done t=$((SECONDS - T0))"
