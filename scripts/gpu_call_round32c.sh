#!/usr/bin/env bash
# On the GPU machine, call 3 of round 32 (#21): decode at the context lengths agents reach
# (8k and 32k prompt tokens, batches 1 and 4, 0.6B and 1.7B), on the graphs and eagerly
# (--compare-eager: an eager step cuts the attention in partitions of 32 tokens, a graph of
# up to 4 rows in 32 partitions whatever the context), against the roofline of weights + KV.
# Then, where Nsight Systems is installed, the kernels of 1.7B batch-1 steps as they run in the
# graph (each kernel's mean time in the chain, overlap included; scripts/nsys_table.py).
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b
for s in 0.6b 1.7b; do for p in 8000 32000; do
  timeout 200 .gpu/bench --model-dir /tmp/m-$s --no-peer --prompt $p --batches 1,4 --new 64 \
    --compare-eager > "$OUT/long-$s-$p.log" 2>&1
  echo "== $s prompt $p rc $?"; grep -E "^ours(-eager)? decode|Error" "$OUT/long-$s-$p.log" | sed 's/; prefill.*//' 
done; done
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "== nsys: ${NSYS:-none}"
if [ -n "$NSYS" ]; then
  timeout 150 "$NSYS" profile --cuda-graph-trace=node -t cuda -o "$OUT/nsys-1.7b" -f true \
    .gpu/bench --model-dir /tmp/m-1.7b --no-peer --batches 1 --new 200 --max-graph-batch 8 \
    > "$OUT/nsys.log" 2>&1
  echo "== nsys rc $?"
  timeout 120 "$NSYS" stats --report cuda_gpu_kern_sum --format csv -o "$OUT/nsys-1.7b" \
    "$OUT/nsys-1.7b.nsys-rep" > /dev/null 2>&1
  head -30 "$OUT"/nsys-1.7b*_sum*.csv 2>/dev/null | cut -c1-160
fi
