#!/usr/bin/env bash
# Round 45, call 3 (NOT RUN in round 45: no device was lent after call 2): the split 3-8-row
# tensor-core matmuls (--gemv-mma-split N: a group of 16 rows on a cluster of two 4-warp
# blocks for weights of at most N groups: 131 takes 0.6B's o and down, 192 its gate|up too,
# 256 its qkv too; 1.7B's o has 128), off by default. kernel_check --gemv-only (presum.rs
# split_bits, bit for bit against the one-block kernels), the batch-8 ops both ways, batches
# 3, 4 and 8 after 512-token prompts on 0.6B and batch 8 on 1.7B beside the default (two
# interleaved runs), graph_check with it.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 160 --model-dir /tmp/m-0.6b --gemv-only
echo "split checks: $(grep -c "gemv_mma_split" "$OUT/gemv.log"), failed: $(grep "gemv_mma_split" "$OUT/gemv.log" | grep -c FAIL)"
for n in 0 256; do
  f=""; [ $n -gt 0 ] && f="--gemv-mma-split $n"
  timeout 60 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 8 $f > "$OUT/prof8-$n.log" 2>&1
  echo "== profile 8 [$f] rc $?"; grep -E "^\| (o_proj|down|gate_up\+silu) \(ours|^batch|^sum of ops" "$OUT/prof8-$n.log" | cut -c1-160 | head -8
done
B="--prompt 512 --batches 3,4,8 --new 128"
for r in 1 2; do
  row "0.6b [] run $r" --model-dir /tmp/m-0.6b $B
  row "0.6b [split 131] run $r" --model-dir /tmp/m-0.6b $B --gemv-mma-split 131
  row "0.6b [split 192] run $r" --model-dir /tmp/m-0.6b $B --gemv-mma-split 192
  row "0.6b [split 256] run $r" --model-dir /tmp/m-0.6b $B --gemv-mma-split 256
done
for r in 1 2; do
  row "1.7b b8 [] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 8 --new 128
  row "1.7b b8 [split] run $r" --model-dir /tmp/m-1.7b --prompt 512 --batches 8 --new 128 --gemv-mma-split 131
done
left 400 && { timeout 170 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 600 --gemv-mma-split 256 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
