#!/usr/bin/env bash
# Prepared in round 40, not yet run (no device time left): KernelOptions::fused_mma_one
# (commit ce4c330: 1-row decode steps take the fused attention's tensor-core loop at two
# stages, 2-row steps keep one). kernel_check --model-only (every fused case on both stage
# counts, bit for bit against the unfused tensor-core kernels), graph_check with it, then
# batches 1 and 2 after 512 and 2k tokens on both shapes, default / --fused-mma-one 2,
# interleaved.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
kc kc-model 120 --model-only --model-dir /tmp/m-mix --fused-mma-one 2
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --fused-mma-one 2 > "$OUT/gc.log" 2>&1
echo "== gc fused-mma-one 2 rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for r in 1 2 3; do
  for v in "" "--fused-mma-one 2"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
    row "0.6b p2048 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 2048 --batches 1,2 --new 128 $v
    row "1.7b p512 run $r [$v]" --model-dir /tmp/m-1.7b --prompt 512 --batches 1,2 --new 128 $v
  done
done
echo "done t=$((SECONDS - T0))"
# Added in round 41: the current batch-1 ops alone (default and --fused-mma-one 2), the base
# for folding o into the fused attention.
for v in "" "--fused-mma-one 2"; do
  timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1 $v > "$OUT/prof.log" 2>&1
  echo "== profile 0.6b [$v] rc $? t=$((SECONDS - T0))"
  grep -v "^\s*$" "$OUT/prof.log" | grep -v -E "^(graph-check|  [a-z]+ [0-9]+/[0-9]+)" | cut -c1-150 | head -40
done
echo "done2 t=$((SECONDS - T0))"
