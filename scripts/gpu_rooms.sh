#!/usr/bin/env bash
# One device call for the rooms issue (#19): the attention kernels now take one `#[repr(C)]`
# parameter struct each (kernels/attention.cuh, src/engine/cuda/params.rs), so their machine
# code changed; this re-checks every kernel against the candle-op reference (kernel_check),
# graphs against eager steps and the engine against itself (graph_check), and benches decode
# and prefill on 0.6B and 1.7B to compare with BENCHMARKS.md's last numbers.
# Expects .gpu/{bench,graph_check,kernel_check}.xz (scripts/gpu_unpack.sh).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; S="$OUT/summary.txt"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$S"
for c in 0.6b 1.7b; do [ -d /tmp/m-$c ] || .gpu/bench --config tests/fixtures/qwen3/config-$c.json --write-model /tmp/m-$c > /dev/null 2>&1; done
t0=$(date +%s)
timeout 200 .gpu/kernel_check --model-dir /tmp/m-0.6b > "$OUT/kernel_check.log" 2>&1
echo "kernel_check exit $? ($(( $(date +%s) - t0 )) s)" | tee -a "$S"
grep -E "FAIL|kernel-check" "$OUT/kernel_check.log" | tee -a "$S"
t0=$(date +%s)
timeout 240 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 3000 > "$OUT/graph_check.log" 2>&1
echo "graph_check exit $? ($(( $(date +%s) - t0 )) s)" | tee -a "$S"
grep -E "FAIL|graph-check" "$OUT/graph_check.log" | tee -a "$S"
for c in 0.6b 1.7b; do
  timeout 120 .gpu/bench --no-peer --model-dir /tmp/m-$c --batches 1,8,64 > "$OUT/bench-$c.log" 2>&1
  grep -E "^ours decode" "$OUT/bench-$c.log" | sed "s/^/$c /" | tee -a "$S"
done
timeout 120 .gpu/bench --no-peer --model-dir /tmp/m-0.6b --batches 1 --prompt 8192 --new 8 > "$OUT/bench-prefill.log" 2>&1
grep -E "^ours" "$OUT/bench-prefill.log" | sed "s/^/0.6b prompt 8192 /" | tee -a "$S"
