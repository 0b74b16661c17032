#!/usr/bin/env bash
# Round 47 (#29; after scripts/gpu_call_round46.sh and 46b.sh, on the binaries of the commit
# that added --moe-down-prefetch): one-token MoE steps whose experts' gate|up prefetches the
# routed experts' down weights into L2 and loads its own rows evict-first (--moe-down-prefetch
# MIB, off by default; 0: the evict-first loads alone). Round 46's chain map put a 30B-A3B
# layer's experts (routing, gate|up, down + sum) at 32.5 us for 75.5 MB (2.3 TB/s); gate|up
# alone ~14 us (50 MB), down ~8 (25 MB): the memory idles across their boundary. And the down +
# sum launch with each token's expert order ranked by one warp instead of thread 0's insertion
# sort (--moe-rank-sort, off; the sort sits between its wait and its first weight load).
# kernel_check --model-only on the mixed MoE model with it at 12 (the bit checks at 0 / 1 / 12
# / 64 MiB run in every --model-only call), bench rows on 4 layers at batch 1 beside the
# default (two interleaved runs) at 0 / 6 / 12 / 25 MiB and 12 with --attn-l2-prefetch 36
# (round 46's MoE form), --moe-rank-sort alone and with 12 MiB, batch 2 and 8 rows (the
# prefetch leaves them alone: a check that it does; the ranks apply there too), the experts'
# share of the chain with each (--profile-skip 128; 48 layers extrapolated from 4, as in round
# 46), graph_check stress with both on 4 layers.
set -u
source scripts/gpu_lib.sh
moe_model 4; mix_model; echo "models t=$((SECONDS - T0))"
kc kcm 150 --model-only --model-dir /tmp/m-mix --moe-down-prefetch 12 --moe-rank-sort
echo "down prefetch checks: $(grep -c "moe down prefetch" "$OUT/kcm.log"), failed: $(grep "moe down prefetch" "$OUT/kcm.log" | grep -c FAIL)"
echo "rank checks: $(grep -c "ranked by a warp =" "$OUT/kcm.log"), failed: $(grep "ranked by a warp =" "$OUT/kcm.log" | grep -c FAIL)"
grep -E "moe timing T1 down prefetch|moe timing T. tile 1" "$OUT/kcm.log"
B="--prompt 512 --batches 1 --new 128"
for r in 1 2; do
  row "moe4 [] run $r" --model-dir /tmp/m-moe4 $B
  for mib in 0 6 12 25; do row "moe4 [dpf $mib] run $r" --model-dir /tmp/m-moe4 $B --moe-down-prefetch $mib; done
  row "moe4 [dpf 12, attn pf 36] run $r" --model-dir /tmp/m-moe4 $B --moe-down-prefetch 12 --attn-l2-prefetch 36
  row "moe4 [rank] run $r" --model-dir /tmp/m-moe4 $B --moe-rank-sort
  row "moe4 [rank, dpf 12] run $r" --model-dir /tmp/m-moe4 $B --moe-rank-sort --moe-down-prefetch 12
done
row "moe4 [] b2,8" --model-dir /tmp/m-moe4 --prompt 512 --batches 2,8 --new 64
row "moe4 [dpf 12] b2,8" --model-dir /tmp/m-moe4 --prompt 512 --batches 2,8 --new 64 --moe-down-prefetch 12
row "moe4 [rank] b2,8" --model-dir /tmp/m-moe4 --prompt 512 --batches 2,8 --new 64 --moe-rank-sort
for v in "" "--moe-down-prefetch 12" "--moe-rank-sort"; do
  left 400 || break
  timeout 120 .gpu/graph_check --model-dir /tmp/m-moe4 --profile 1 --profile-skip 64,128 $v \
    > "$OUT/skip-moe.log" 2>&1
  echo "== moe4 profile-skip [$v] rc $? t=$((SECONDS - T0))"
  grep -E "^batch .* graph_pdl (1|1, without)" "$OUT/skip-moe.log" | sed 's/ back to back//; s/; with argmax.*//'
done
left 450 && { timeout 140 .gpu/graph_check --model-dir /tmp/m-moe4 --stress-steps 600 --moe-down-prefetch 12 --moe-rank-sort > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
