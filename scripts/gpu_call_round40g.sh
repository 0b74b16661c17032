#!/usr/bin/env bash
# On the GPU machine, round 40's call 7 (#29): KernelOptions::moe_down_early (the one-pair MoE
# down + sum reads the routing tables and copies its first round of weights into shared memory
# before its wait; the gate|up before it lets it in after its own wait; off by default).
# kernel_check --model-only on the mixed MoE model with it (bit for bit against down + sum,
# two routings; the model against candle), graph_check on 4 layers, decode on 4 and 8 layers
# default / early.
# Ran on commit 614656d's binaries; --moe-down-early and its kernels were removed after this call
# (slower; BENCHMARKS.md), so this script needs that commit.
set -u
source scripts/gpu_lib.sh
mix_model; moe_model 4; echo "models t=$((SECONDS - T0))"
kc kc-moe 120 --model-only --model-dir /tmp/m-mix --moe-down-early
grep -E "^moe down early" "$OUT/kc-moe.log" | grep -vE " ok$" | head -5
grep -cE "^moe down early.* ok$" "$OUT/kc-moe.log"
grep -E "moe timing T[128] tile 1" "$OUT/kc-moe.log"
timeout 90 .gpu/graph_check --model-dir /tmp/m-moe4 --stress-steps 100 --moe-down-early > "$OUT/gc.log" 2>&1
echo "== gc moe4 early rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for r in 1 2; do
  for v in "" "--moe-down-early"; do
    row "moe4 run $r [$v]" --model-dir /tmp/m-moe4 --prompt 256 --batches 1,2,8 --new 64 $v
  done
done
left 300 && { rm -rf /tmp/m-moe4; moe_model 8; echo "moe8 t=$((SECONDS - T0))"; }
for v in "" "--moe-down-early" "" "--moe-down-early"; do
  [ -d /tmp/m-moe8 ] && left 360 && row "moe8 [$v]" --model-dir /tmp/m-moe8 --prompt 256 --batches 1,2,8 --new 64 $v
done
echo "done t=$((SECONDS - T0))"
