#!/usr/bin/env bash
# One device call for the CUDA-graph work: graph checks (every bucket vs eager, shrink/grow,
# engine on/off, 10k-step stress), decode with graphs on vs off in one run per shape, and the
# op profile of a decode step. Expects .gpu/{bench,graph_check}.xz (scripts/gpu_unpack.sh).
# Env: BATCHES_0_6B, BATCHES_1_7B (decode batch sizes of the bench per shape).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; S="$OUT/summary.txt"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$S"
for c in 0.6b 1.7b; do [ -d /tmp/m-$c ] || .gpu/bench --config tests/fixtures/qwen3/config-$c.json --write-model /tmp/m-$c > /dev/null 2>&1; done
timeout 200 .gpu/graph_check --model-dir /tmp/m-0.6b > "$OUT/graph_check.log" 2>&1; echo "graph_check exit $?" | tee -a "$S"
grep -v WARN "$OUT/graph_check.log" | tee -a "$S"
timeout 90 .gpu/bench --model-dir /tmp/m-0.6b --no-peer --compare-eager --batches ${BATCHES_0_6B:-1,2,4,8,16,64,256} > "$OUT/bench-0.6b.log" 2>&1
grep -E "^(ours|check)" "$OUT/bench-0.6b.log" | tee -a "$S"
timeout 60 .gpu/bench --model-dir /tmp/m-1.7b --no-peer --compare-eager --batches ${BATCHES_1_7B:-1,8,64} > "$OUT/bench-1.7b.log" 2>&1
grep -E "^ours(-eager)? decode" "$OUT/bench-1.7b.log" | sed 's/^/1.7b /' | tee -a "$S"
timeout 30 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,8 2>&1 | grep -v WARN > "$OUT/profile-ops.txt"
grep -E "sum of|graph replay" "$OUT/profile-ops.txt" | tee -a "$S"
echo "==== summary"; cat "$S"
