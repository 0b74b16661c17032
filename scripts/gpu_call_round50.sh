#!/usr/bin/env bash
# Round 50, one call (#21, #29): what rounds 49-50 built without a GPU, measured.
# - #21: the fused decode attention's K/V evict-first in L2 (--kv-evict-first: fused_decode_kef),
#   after the skinny matmuls' weights evict-first went on by default for dense models (round 49:
#   0.6B batch 8 +11.6%), and with it the next layer's K/V prefetched into L2 before the wait
#   (--kv-next-prefetch: fused_decode_knp; at batch 8 the attention takes 14.9 us a layer in the
#   chain against 11.1 with its K/V in L2), issued before the wait or after the attention loop
#   (--kv-next-prefetch-late): 0.6B and 1.7B at batches 1 and 8, two rounds each.
# - #29: one token's router matmul and routing in one cluster launch (--moe-router-route:
#   moe_router_route*_bf16; one launch and one trip of the logits through memory fewer a layer),
#   and the add+RMSNorm before them in it too (--moe-norm-router-route: two launches fewer):
#   the 30B-A3B shape on 8 layers at batch 1 and on 4 at batches 1 / 2 / 8 (2 and 8 do not take it,
#   so they must be flat).
# kernel_check --model-only on the mixed MoE model checks both bit for bit (the fused cases on the
# K/V evict-first build; the one launch's logits and experts' output against the matmul then the
# one-warp routing, and that it served; the fused cases again on the next-layer prefetch build);
# then the chain map of 0.6B at batches 1 and 8 with and without --kv-next-prefetch if time is
# left.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round50.sh`, BUDGET the seconds the call
# may spend (the device time left less a start, a minute or two): what matters most runs first
# (each model written just before its first use), and no command runs past BUDGET + 30 s.
set -u
source scripts/gpu_lib.sh
model 0.6b; mix_model; echo "models t=$((SECONDS - T0))"
kc kcm 120 --model-only --model-dir /tmp/m-mix
for w in "kv evict-first" "kv next-layer prefetch" "router+route"; do
  echo "$w checks: $(grep -c "$w" "$OUT/kcm.log"), failed: $(grep "$w" "$OUT/kcm.log" | grep -c FAIL)"
done
grep -E "moe timing T1 (router|routing)" "$OUT/kcm.log"
M=("" "--moe-router-route" "--moe-norm-router-route" "--moe-norm-router-route --kv-next-prefetch")
D=("" "--kv-evict-first" "--kv-next-prefetch" "--kv-next-prefetch --kv-next-prefetch-late")
sweep d06 130 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128" "${D[@]}"
left && moe_model 8
sweep moe8 120 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128" "${M[@]}"
left && model 1.7b
sweep d17 130 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128" "${D[@]}"
left && moe_model 4
sweep moe4 90 "--model-dir /tmp/m-moe4 --prompt 512 --batches 1,2,8 --new 128" "${M[@]:0:3}"
i=0
for v in "" "--kv-next-prefetch"; do
  left || break
  i=$((i + 1))
  timeout "$(cap 35)" .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,8 --profile-skip 2,4,8,16 $v > "$OUT/skip$i.log" 2>&1
  echo "== 0.6b profile-skip [$v] rc $? t=$((SECONDS - T0))"
  grep -E "^batch .* graph_pdl" "$OUT/skip$i.log" | sed 's/ back to back//; s/; with argmax.*//' | cut -c1-160
done
echo "done t=$((SECONDS - T0))"
