#!/usr/bin/env bash
# Round 46, call 3 (NOT RUN in round 46: no device was lent after call 2; run it on the
# binaries of the commit that added --attn-l2-prefetch-early, then gpu_call_round46b.sh):
# the fused decode attention prefetching the weights after it into L2 once its wait is over
# (--attn-l2-prefetch MIB, off by default: o, then gate|up, then down, then the next layer's
# qkv; the chain map of call 2 showed the attention ~6 us a layer in the chain with 2.5 MB of
# K/V, the memory nearly idle). kernel_check --model-only with it on the mixed MoE model (the
# fused cases once more on l2_kernels; the MoE forward against candle), bench rows beside the
# default (two interleaved runs): 0.6B batches 1 and 8 at 4 (o), 16 (o + gate|up) and 22 MiB
# (all three), 1.7B batch 1 at 8, 20, 32 and 44, the 30B-A3B shape on 4 layers at 16 (o) and 36
# (o and the next layer's qkv); 22 / 32 / 36 with --attn-l2-prefetch-early (issued as the
# attention's blocks start, beside the qkv matmul, instead of after their wait); the
# chain map of 0.6B batch 1 with it at 22; graph_check stress with it.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; moe_model 4; mix_model; echo "models t=$((SECONDS - T0))"
kc kcm 150 --model-only --model-dir /tmp/m-mix --attn-l2-prefetch 16
echo "l2 prefetch checks: $(grep -c "l2 prefetch" "$OUT/kcm.log"), failed: $(grep "l2 prefetch" "$OUT/kcm.log" | grep -c FAIL)"
B="--prompt 512 --batches 1,8 --new 128"
for r in 1 2; do
  row "0.6b [] run $r" --model-dir /tmp/m-0.6b $B
  for mib in 4 16 22; do row "0.6b [pf $mib] run $r" --model-dir /tmp/m-0.6b $B --attn-l2-prefetch $mib; done
  row "0.6b [pf 22 early] run $r" --model-dir /tmp/m-0.6b $B --attn-l2-prefetch 22 --attn-l2-prefetch-early
done
for r in 1 2; do
  row "1.7b [] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128
  for mib in 8 20 32 44; do row "1.7b [pf $mib] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 --attn-l2-prefetch $mib; done
  row "1.7b [pf 32 early] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 --attn-l2-prefetch 32 --attn-l2-prefetch-early
done
for r in 1 2; do
  row "moe4 [] run $r" --model-dir /tmp/m-moe4 --prompt 512 --batches 1 --new 128
  row "moe4 [pf 16] run $r" --model-dir /tmp/m-moe4 --prompt 512 --batches 1 --new 128 --attn-l2-prefetch 16
  row "moe4 [pf 36] run $r" --model-dir /tmp/m-moe4 --prompt 512 --batches 1 --new 128 --attn-l2-prefetch 36
  row "moe4 [pf 36 early] run $r" --model-dir /tmp/m-moe4 --prompt 512 --batches 1 --new 128 --attn-l2-prefetch 36 --attn-l2-prefetch-early
done
timeout 100 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1 --profile-skip 4,8,16 --attn-l2-prefetch 22 \
  > "$OUT/skip-pf.log" 2>&1
echo "== 0.6b profile-skip [pf 22] rc $? t=$((SECONDS - T0))"
grep -E "^batch .* graph_pdl (1|1, without)" "$OUT/skip-pf.log" | sed 's/ back to back//; s/; with argmax.*//'
left 420 && { timeout 170 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --attn-l2-prefetch 22 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
