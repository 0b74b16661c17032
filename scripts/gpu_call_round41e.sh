#!/usr/bin/env bash
# Round 41, call 5: the o fold reading o's weights from global memory (L2) after the merge
# (--fused-o-l2: no more shared memory than the unfolded kernel) against the staged form and
# the default. kernel_check --model-only with it (o_fold.rs checks both forms; the f32 model's
# checks, which call 4's build failed: its f32 deltas were taken for the fold's partials),
# graph_check with it, batch 1 after 512 tokens interleaved, the batch-1 graph replay.
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
kc kc-fold 150 --model-only --model-dir /tmp/m-0.6b --fused-o --fused-o-l2
grep -E "o fold" "$OUT/kc-fold.log" | head -2
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --fused-o --fused-o-l2 > "$OUT/gc.log" 2>&1
echo "== gc fused-o-l2 rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for r in 1 2 3; do
  for v in "" "--fused-o" "--fused-o --fused-o-l2"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
  done
done
for v in "" "--fused-o" "--fused-o --fused-o-l2"; do
  timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1 $v > "$OUT/prof.log" 2>&1
  echo "== profile 0.6b [$v] rc $? t=$((SECONDS - T0))"
  grep -E "graph replay" "$OUT/prof.log" | cut -c1-150
done
echo "done t=$((SECONDS - T0))"
