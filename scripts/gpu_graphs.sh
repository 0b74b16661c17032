#!/usr/bin/env bash
# One device call for the CUDA-graph work: kernel checks, graph checks (buckets, shrink/grow,
# engine on/off, 10k-step stress), and decode with graphs on vs off in one run per shape.
# Expects .gpu/{bench,kernel_check,graph_check}.gz. Env: SKIP_KERNEL_CHECK=1, SKIP_GRAPH_CHECK=1,
# CONFIGS="0.6b 1.7b", BATCHES=1,2,4,8,16,64,256, BENCH_ARGS.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$S"
for c in ${CONFIGS:-0.6b 1.7b}; do
  [ -d /tmp/m-$c ] || .gpu/bench --config tests/fixtures/qwen3/config-$c.json --write-model /tmp/m-$c > "$OUT/write-$c.log" 2>&1
done
if [ "${SKIP_KERNEL_CHECK:-0}" != 1 ]; then
  timeout 240 .gpu/kernel_check --model-dir /tmp/m-0.6b > "$OUT/kernel_check.log" 2>&1; echo "kernel_check exit $?" >> "$OUT/kernel_check.log"
  grep -E "FAIL|kernel-check|exit" "$OUT/kernel_check.log" | tee -a "$S"
fi
if [ "${SKIP_GRAPH_CHECK:-0}" != 1 ]; then
  timeout ${GRAPH_TIMEOUT:-300} .gpu/graph_check --model-dir /tmp/m-0.6b ${GRAPH_ARGS:-} > "$OUT/graph_check.log" 2>&1; echo "graph_check exit $?" >> "$OUT/graph_check.log"
  grep -vE "^\s*$" "$OUT/graph_check.log" | grep -v "WARN" | tail -30 | tee -a "$S"
fi
for c in ${CONFIGS:-0.6b 1.7b}; do
  timeout ${BENCH_TIMEOUT:-200} .gpu/bench --model-dir /tmp/m-$c --no-peer --compare-eager --batches ${BATCHES:-1,2,4,8,16,64,256} ${BENCH_ARGS:-} > "$OUT/bench-$c.log" 2>&1
  echo "== bench $c (exit $?)" | tee -a "$S"
  grep -E "^(ours|check|# engine)" "$OUT/bench-$c.log" | cut -c1-200 | tee -a "$S"
done
echo "==== summary"; cat "$S"
