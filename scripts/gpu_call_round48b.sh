#!/usr/bin/env bash
# Round 48, call 2 (#29, and the model-level checks of #21's variants): what rounds 46-47 built
# for the MoE floor and never ran, as bench sweeps (`bench --variant`, two rounds interleaved).
# It replaces gpu_call_round47.sh and the MoE rows of gpu_call_round46.sh. In priority order:
#  1. kernel_check --model-only on the mixed MoE model with every variant's flag: the fused
#     attention's cases once more on the L2 / K/V prefetching kernels, the MoE gate|up prefetching
#     down and the ranked down + sum bit for bit against the default, the greedy engine check.
#  2. The 30B-A3B shape on 4 layers, batch 1: the attention's weight prefetch at 16 / 36 MiB and
#     early at 36; the experts' down prefetch at 0 / 6 / 12 / 25 MiB and 12 with 36 of the
#     attention's; the ranked down + sum alone and with 12 MiB.
#  3. Batches 2 and 8 with the down prefetch and the ranks (both should change nothing there).
#  4. graph_check stress with all three on.
#  5. The experts' share of the chain (--profile-skip 64,128) with each.
set -u
source scripts/gpu_lib.sh
moe_model 4; mix_model; echo "models t=$((SECONDS - T0))"
kc kcm 150 --model-only --model-dir /tmp/m-mix --attn-kv-prefetch 128 --attn-l2-prefetch 16 \
  --moe-down-prefetch 12 --moe-rank-sort
echo "l2 prefetch checks: $(grep -c "l2 prefetch" "$OUT/kcm.log"), failed: $(grep "l2 prefetch" "$OUT/kcm.log" | grep -c FAIL)"
echo "down prefetch checks: $(grep -c "moe down prefetch" "$OUT/kcm.log"), failed: $(grep "moe down prefetch" "$OUT/kcm.log" | grep -c FAIL)"
echo "rank checks: $(grep -c "ranked by a warp =" "$OUT/kcm.log"), failed: $(grep "ranked by a warp =" "$OUT/kcm.log" | grep -c FAIL)"
grep -E "moe timing T1 down prefetch|moe timing T. tile 1" "$OUT/kcm.log"
sweep moe4 240 "--model-dir /tmp/m-moe4 --prompt 512 --batches 1 --new 128" "" \
  "--attn-l2-prefetch 16" "--attn-l2-prefetch 36" "--attn-l2-prefetch 36 --attn-l2-prefetch-early" \
  "--moe-down-prefetch 0" "--moe-down-prefetch 6" "--moe-down-prefetch 12" "--moe-down-prefetch 25" \
  "--moe-down-prefetch 12 --attn-l2-prefetch 36" "--moe-rank-sort" "--moe-rank-sort --moe-down-prefetch 12"
sweep moe4-b28 70 "--model-dir /tmp/m-moe4 --prompt 512 --batches 2,8 --new 64" "" \
  "--moe-down-prefetch 12" "--moe-rank-sort"
left 450 && { timeout 100 .gpu/graph_check --model-dir /tmp/m-moe4 --stress-steps 400 --moe-down-prefetch 12 \
  --moe-rank-sort --attn-l2-prefetch 36 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
for v in "" "--moe-down-prefetch 12" "--moe-rank-sort"; do
  left 540 || break
  timeout 60 .gpu/graph_check --model-dir /tmp/m-moe4 --profile 1 --profile-skip 64,128 $v \
    > "$OUT/skip-moe.log" 2>&1
  echo "== moe4 profile-skip [$v] rc $? t=$((SECONDS - T0))"
  grep -E "^batch .* graph_pdl (1|1, without)" "$OUT/skip-moe.log" | sed 's/ back to back//; s/; with argmax.*//'
done
echo "done t=$((SECONDS - T0))"
