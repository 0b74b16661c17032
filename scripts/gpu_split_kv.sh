#!/usr/bin/env bash
# Split-KV prefill (#20): kernel_check (every prefill kernel, the split variant included, and
# the attention timing table), then the agent workload with and without --split-kv.
set -u
source scripts/gpu_lib.sh
model 0.6b
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b > "$OUT/kernel_check.log" 2>&1
echo "kernel_check exit $?" | tee -a "$S"
grep -E "FAIL|kernel-check|prefill-attention flash " "$OUT/kernel_check.log" | tee -a "$S"
grep -E "prefill-attention flash-nosplit" "$OUT/kernel_check.log" | tee -a "$S"
for f in "" --no-split-kv; do
  timeout 60 .gpu/bench --model-dir /tmp/m-0.6b --agent 64,10 --agent-only $f 2>&1 | grep "cache=on" | sed "s/^/split-kv=${f:-on} /" | tee -a "$S"
done
