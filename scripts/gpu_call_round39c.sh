#!/usr/bin/env bash
# On the GPU machine, round 39's call 3 (#21, #29): the presummed norm's second form
# (--norm-presum: the partial sums and the residual loaded right after the wait and used after
# the loop; the input rounded as bf16(h * w), the dot products times 1 / rms), checked and
# measured against the default; decode rows of the defaults at batches 1-512 (the issue's
# table); the MoE shape's batch-1 op profile (the next lever of #29).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc kc-presum 150 --model-dir /tmp/m-0.6b --gemv-only --norm-presum
grep -E "^presum" "$OUT/kc-presum.log" | sort -k9 -g | tail -4 | cut -c1-120
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 1000 --norm-presum > "$OUT/gcp.log" 2>&1
echo "== gc presum rc $? t=$((SECONDS - T0))"
grep -E "graph-check|FAIL|shrink|stress:|lockstep|pipelined|on vs off" "$OUT/gcp.log" | cut -c1-140 | head -8
for r in 1 2; do
  for v in "" "--norm-presum"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --batches 3,4,8 --new 128 $v
  done
done
row "0.6b p512 defaults" --model-dir /tmp/m-0.6b --batches 1,8,64,256,512 --new 128
row "1.7b p512 defaults" --model-dir /tmp/m-1.7b --batches 1,8,64,256,512 --new 128
left 400 && { moe_model 2; timeout 100 .gpu/graph_check --model-dir /tmp/m-moe2 --profile 1 > "$OUT/moeprof.log" 2>&1
  echo "== moe profile rc $? t=$((SECONDS - T0))"; grep -E "^\|" "$OUT/moeprof.log" | head -40 | cut -c1-130; grep -E "graph replay" "$OUT/moeprof.log"; }
echo "done t=$((SECONDS - T0))"
