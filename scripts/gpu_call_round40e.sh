#!/usr/bin/env bash
# On the GPU machine, round 40's call 5 (#29): KernelOptions::moe_route_fold (one token's MoE
# routing folded into the experts' gate|up launch; off by default, not yet measured).
# kernel_check --model-only on the mixed MoE model with it (the folded launch against the
# routing and gate|up apart, bit for bit; the model against candle), graph_check on 4 layers
# with it, then decode on 4 and 8 layers of the 30B-A3B shape (batches 1, 2, 8; default /
# folded, two runs) for the per-layer difference.
# Ran on commit 3dca6a5's binaries; --moe-route-fold and its kernel were removed after this call
# (slower; BENCHMARKS.md), so this script needs that commit.
set -u
source scripts/gpu_lib.sh
mix_model; moe_model 4; echo "models t=$((SECONDS - T0))"
kc kc-moe 150 --model-only --model-dir /tmp/m-mix --moe-route-fold
grep -E "^moe route folded" "$OUT/kc-moe.log" | grep -vE " ok$" | head -5
grep -cE "^moe route folded.* ok$" "$OUT/kc-moe.log"
grep -E "moe timing T1 routing" "$OUT/kc-moe.log"
timeout 150 .gpu/graph_check --model-dir /tmp/m-moe4 --stress-steps 200 --moe-route-fold > "$OUT/gc.log" 2>&1
echo "== gc moe4 fold rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for r in 1 2; do
  for v in "" "--moe-route-fold"; do
    row "moe4 run $r [$v]" --model-dir /tmp/m-moe4 --prompt 256 --batches 1,2,8 --new 64 $v
  done
done
left 420 && { moe_model 8; echo "moe8 t=$((SECONDS - T0))"; }
for v in "" "--moe-route-fold" "" "--moe-route-fold"; do
  [ -d /tmp/m-moe8 ] && row "moe8 [$v]" --model-dir /tmp/m-moe8 --prompt 256 --batches 1,2,8 --new 64 $v
done
echo "done t=$((SECONDS - T0))"
