#!/usr/bin/env bash
# On the GPU machine, the next call (#29, #21): the cuBLASLt descriptors built once (host work,
# compiled without a GPU). kernel_check --model-only on the mixed 30B-A3B-shape model and
# graph_check --rows-check on the MoE and 0.6B shapes (the same bits as round 30); prefill of
# 256-1,024-token prompts with and without --no-blas-row-class (round 30 measured decode only);
# decode at 1, 8, 64 with the defaults on 0.6B and 1.7B; graph_check on the 4-layer MoE shape
# with the new lockstep engine check (32 requests in one submit_batch, graphs on vs off).
set -u
source scripts/gpu_lib.sh
mix_model; moe_model 4; model 0.6b; model 1.7b
timeout 150 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
echo "== kc rc $?"; grep -E "^kernel-check|FAILED|Error|panic" "$OUT/kc.log" | head -8
for m in moe4 0.6b; do
  timeout 150 .gpu/graph_check --model-dir /tmp/m-$m --rows-check > "$OUT/rows-$m.log" 2>&1
  echo "== rows $m rc $?"; grep -E "^\| [a-z]|graph-check|Error" "$OUT/rows-$m.log"
done
for s in 0.6b 1.7b; do for p in 256 512 1024; do for v in "" "--no-blas-row-class"; do
  run "$s-p$p${v:+-off}" --model-dir /tmp/m-$s --prompt $p $v
done; done; done
for s in 0.6b 1.7b; do
  timeout 90 .gpu/bench --model-dir /tmp/m-$s --no-peer --batches 1,8,64 > "$OUT/b.log" 2>&1
  echo "== decode $s rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done
timeout 240 .gpu/graph_check --model-dir /tmp/m-moe4 --stress-steps 100 > "$OUT/gc-moe4.log" 2>&1
echo "== gc moe4 rc $?"; grep -E "graph-check|FAIL|engine|shrink|stress:" "$OUT/gc-moe4.log" | cut -c1-220 | head -14
