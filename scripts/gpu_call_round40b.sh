#!/usr/bin/env bash
# On the GPU machine, round 40's call 2 (#21): the fused MLP (--mlp-fused N) at two blocks an
# SM (128 registers) with its cluster sums stored into the summing rank's shared memory (one
# cluster barrier; --mlp-fused-pull: the first form's loads and two barriers). Checks
# (kernel_check --gemv-only: every form against the three launches; graph_check), the ops
# alone (graph_check --profile 1,2: the MLP as two launches / one, with the next norm + qkv),
# rows at batches 1, 2 after 512-token prompts, and Nsight Compute on a batch-1 step's matmul
# kernels, default and fused (each launch alone, L2 flushed).
# Ran on commit acc6194's binaries; --mlp-fused and its kernels were removed after call 4 (slower;
# BENCHMARKS.md), so this script needs that commit.
set -u
source scripts/gpu_lib.sh
NCU=/usr/local/cuda/bin/ncu
[ -x "$NCU" ] || NCU=$(command -v ncu)
model 0.6b; echo "models t=$((SECONDS - T0))"
kc kc-mlp 150 --gemv-only --model-dir /tmp/m-0.6b --mlp-fused 16
grep -E "^mlp fused" "$OUT/kc-mlp.log" | grep -vE " ok$" | head -5
grep -cE "^mlp fused.* ok$" "$OUT/kc-mlp.log"
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --mlp-fused 16 > "$OUT/gc.log" 2>&1
echo "== gc mlp-fused 16 rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gc.log" | cut -c1-140 | head -8
for v in "--mlp-fused 16" "--mlp-fused 16 --mlp-fused-pull"; do
  timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,2 $v > "$OUT/prof.log" 2>&1
  echo "== profile [$v] rc $? t=$((SECONDS - T0))"
  grep -E "^## batch|MLP|norm\+qkv|add\+norm|down \(ours\)|sum of ops|graph replay" "$OUT/prof.log" | cut -c1-150
done
for r in 1 2; do
  for v in "" "--mlp-fused 16" "--mlp-fused 8" "--mlp-fused 16 --mlp-fused-pull"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
  done
done
KRE='regex:^(mlp_fused|pnorm|sdnorm|dnorm|gemv_t1|decode_fused)'
for v in "" "--mlp-fused 16"; do
  left 450 || break
  n=ncu${v:+-mlp}
  timeout 120 "$NCU" --clock-control none --cache-control all -k "$KRE" --launch-skip 3000 \
    --launch-count 60 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --metrics dram__bytes_read.sum -o "$OUT/$n" -f .gpu/bench --model-dir /tmp/m-0.6b --no-peer \
    --batches 1 --new 100 --warmup-new 2 --max-graph-batch 8 $v > "$OUT/$n.log" 2>&1
  echo "== ncu [$v] rc $? t=$((SECONDS - T0))"
  "$NCU" --import "$OUT/$n.ncu-rep" --csv --page details > "$OUT/$n.csv" 2>/dev/null
  python3 scripts/ncu_table.py "$OUT/$n.csv" | cut -c1-120
done
echo "done t=$((SECONDS - T0))"
