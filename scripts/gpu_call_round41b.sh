#!/usr/bin/env bash
# Round 41, call 2: the o fold (KernelOptions::fused_o, --fused-o; off): kernel_check
# --model-only with it (o_fold.rs: the folded chain against the three launches on both
# shapes' widths, 1-2 rows, 1-2 stages, bf16 and fp8 caches; the engine's logits with it),
# graph_check with it, then batches 1 and 2 after 512 and 2k tokens, default / --fused-o,
# interleaved, and the batch-1 step's graph replay both ways.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; mix_model; echo "models t=$((SECONDS - T0))"
kc kc-fold 150 --model-only --model-dir /tmp/m-0.6b --fused-o
grep -E "o fold" "$OUT/kc-fold.log" | head -3
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --fused-o > "$OUT/gc.log" 2>&1
echo "== gc fused-o rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for r in 1 2 3; do
  for v in "" "--fused-o"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
    row "0.6b p2048 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 2048 --batches 1,2 --new 128 $v
    row "1.7b p512 run $r [$v]" --model-dir /tmp/m-1.7b --prompt 512 --batches 1,2 --new 128 $v
  done
done
for v in "" "--fused-o"; do
  timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1 $v > "$OUT/prof.log" 2>&1
  echo "== profile 0.6b [$v] rc $? t=$((SECONDS - T0))"
  grep -E "graph replay|sum of ops" "$OUT/prof.log" | cut -c1-150
done
echo "done t=$((SECONDS - T0))"
