#!/usr/bin/env bash
# Round 48, call 4, on the binaries with the new MoE defaults (the gate|up's evict-first loads
# on every one-pair tile, the ranked down + sum) and round 46-47's dense variants removed (the
# dense kernels' source is b1086c8's again). (1) kernel_check --model-only on the mixed MoE
# model: every fused-attention and MoE check, the evict-first gate|up and down + sum bit for
# bit against the plain loads, the ranks against the insertion sort. (2) The 30B-A3B shape on
# 4 layers at batches 1 / 2 / 8: the new defaults, the old ones, without the evict-first
# gate|up (now also at 2-8 tokens), with the evict-first down + sum. (3) graph_check on it.
# (4) 8 layers, the new and old defaults at batch 1: a layer's cost from the 4-layer
# difference, for the 48-layer estimate.
set -u
source scripts/gpu_lib.sh
moe_model 4; mix_model; echo "models t=$((SECONDS - T0))"
kc kcm 150 --model-only --model-dir /tmp/m-mix
echo "evict-first checks: $(grep -c "evict-first = plain" "$OUT/kcm.log"), failed: $(grep "evict-first = plain" "$OUT/kcm.log" | grep -c FAIL)"
echo "rank checks: $(grep -c "ranked by a warp =" "$OUT/kcm.log"), failed: $(grep "ranked by a warp =" "$OUT/kcm.log" | grep -c FAIL)"
grep -E "FAIL|moe timing T. gate\|up evict|moe timing T. tile 1: down" "$OUT/kcm.log" | head -12
sweep moe4 150 "--model-dir /tmp/m-moe4 --prompt 512 --batches 1,2,8 --new 128" "" \
  "--no-moe-gate-up-cs --no-moe-rank-sort" "--no-moe-gate-up-cs" "--moe-down-cs"
left 330 && { timeout 100 .gpu/graph_check --model-dir /tmp/m-moe4 --stress-steps 400 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|lockstep|Error|panic" "$OUT/gc.log" | head; }
left 380 && { moe_model 8; echo "moe8 t=$((SECONDS - T0))"; }
[ -d /tmp/m-moe8 ] && sweep moe8 120 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128" "" \
  "--no-moe-gate-up-cs --no-moe-rank-sort"
echo "done t=$((SECONDS - T0))"
