#!/usr/bin/env bash
# On the GPU machine, one call (#29): GQA group 8 through the fused decode attention as two
# group-4 halves a KV head (--gqa8-split). kernel_check --model-only --gqa8-split on the mixed
# 3-layer 30B-A3B-shape model (every fused decode case, the dense groups with the new kv_shift
# among them, and the group-8 cases split, bit for bit the unfused kernels; the MoE model's
# forward against candle with the split on); graph_check's op profile of the attention half
# (2 layers) both ways; a short graph check with it on (4 layers); decode at batches 1, 2, 8 on
# LAYERS layers both ways; dense 0.6B batch 1 and 8 (the kv_shift change in the fused kernel).
set -u
source scripts/gpu_lib.sh
L=${LAYERS:-12}
mix_model
timeout 240 .gpu/kernel_check --model-dir /tmp/m-mix --model-only --gqa8-split > "$OUT/kc.log" 2>&1
echo "kc rc $?"; grep -E "^kernel-check|FAILED|Error|panic" "$OUT/kc.log" | head -8
grep -E "decode_fused split" "$OUT/kc.log" | head -20
for l in 2 4 $L; do moe_model $l; done
for v in "" "--gqa8-split"; do
  timeout 120 .gpu/graph_check --model-dir /tmp/m-moe2 --profile 1,8 $v > "$OUT/prof$v.log" 2>&1
  echo "== profile [$v] rc $?"; grep -E "fused decode attention|qk_norm_rope|paged_decode|o_proj \(ours|graph replay" "$OUT/prof$v.log" | head -12
done
timeout 200 .gpu/graph_check --model-dir /tmp/m-moe4 --gqa8-split --stress-steps 100 > "$OUT/gc.log" 2>&1
echo "gc rc $?"; grep -E "graph-check|FAIL|^\| [0-9]+ \||shrink|requests" "$OUT/gc.log" | head -30
for r in 1 2; do for v in "" "--gqa8-split"; do
  timeout 90 .gpu/bench --model-dir /tmp/m-moe$L --no-peer --new 64 --prompt 256 --batches 1,2,8 $v > "$OUT/b.log" 2>&1
  echo "== moe $L layers run $r [$v] rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done
model 0.6b
timeout 60 .gpu/bench --model-dir /tmp/m-0.6b --no-peer --batches 1,8 > "$OUT/b6.log" 2>&1
echo "== 0.6b rc $?"; grep -E "^ours decode|Error" "$OUT/b6.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
