#!/usr/bin/env bash
# Round 41, call 3 (9e75d33's binaries): why the o fold lost 26% on 0.6B at batch 1 in call 2.
# Its 1-row kernels there took two stages (fused_mma_one's default): 64 KB of stages + 32 KB of
# o + 18 KB static, one block an SM, so a cluster of 16 needs 16 free SMs of one GPC. With
# one stage (--fused-mma-one 1) a block takes 83 KB and two fit an SM. Interleaved rows.
set -u
source scripts/gpu_lib.sh
model 0.6b; echo "models t=$((SECONDS - T0))"
for r in 1 2; do
  for v in "" "--fused-mma-one 1" "--fused-o --fused-mma-one 1" "--fused-o"; do
    row "0.6b p512 run $r [$v]" --model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 $v
  done
done
for v in "--fused-mma-one 1" "--fused-o --fused-mma-one 1"; do
  timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1 $v > "$OUT/prof.log" 2>&1
  echo "== profile 0.6b [$v] rc $? t=$((SECONDS - T0))"
  grep -E "graph replay" "$OUT/prof.log" | cut -c1-150
done
echo "done t=$((SECONDS - T0))"
