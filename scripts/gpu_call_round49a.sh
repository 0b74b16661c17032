#!/usr/bin/env bash
# Round 49, call 1 (#29): the one-pair MoE gate|up's weight rows cached in L2 only
# (--moe-gate-up-nc, ld.global.cg: no L1 line, normal L2 priority) beside the default evict-first
# loads (ld.global.cs) and the plain ones (--no-moe-gate-up-cs): which half of round 48's gain
# (L1 or L2) the evict-first loads bought; and the one-warp routing's picks by two warp
# reductions (--moe-route-redux, ~0.3 us a layer by count). kernel_check --model-only checks both
# bit for bit; the 30B-A3B shape on 4 layers at batches 1 / 2 / 8 and on 8 layers at batch 1,
# two rounds each.
set -u
source scripts/gpu_lib.sh
moe_model 4; moe_model 8; mix_model; echo "models t=$((SECONDS - T0))"
kc kcm 150 --model-only --model-dir /tmp/m-mix
echo "gate|up load checks: $(grep -c "moe gate|up .* = plain" "$OUT/kcm.log"), failed: $(grep "moe gate|up .* = plain" "$OUT/kcm.log" | grep -c FAIL)"
echo "routing checks: $(grep -c "moe route by warp reductions" "$OUT/kcm.log"), failed: $(grep "moe route by warp reductions" "$OUT/kcm.log" | grep -c FAIL)"
grep -E "moe timing T. gate\|up evict|moe timing T1 routing" "$OUT/kcm.log"
V=("" "--moe-gate-up-nc" "--no-moe-gate-up-cs" "--moe-route-redux" "--moe-route-redux --moe-gate-up-nc")
sweep moe4 150 "--model-dir /tmp/m-moe4 --prompt 512 --batches 1,2,8 --new 128" "${V[@]}"
sweep moe8 120 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128" "${V[@]}"
echo "done t=$((SECONDS - T0))"
