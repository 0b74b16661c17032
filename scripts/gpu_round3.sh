#!/usr/bin/env bash
# One device call: graph stress, decode with graphs on vs off (0.6B, 1.7B), the step profile
# (GPU busy/idle per step from events), forced preemption through the HTTP host, op profile.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; S="$OUT/summary.txt"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh
for c in 0.6b 1.7b; do .gpu/bench --config tests/fixtures/qwen3/config-$c.json --write-model /tmp/m-$c > /dev/null 2>&1; done
timeout 200 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-only 2>&1 | grep -v WARN | tail -3 | tee -a "$S"
timeout 150 .gpu/bench --model-dir /tmp/m-0.6b --no-peer --compare-eager --batches 1,2,4,8,16,64,256 > "$OUT/bench-0.6b.log" 2>&1
grep -E "^(ours|check)" "$OUT/bench-0.6b.log" | tee -a "$S"
timeout 100 .gpu/bench --model-dir /tmp/m-1.7b --no-peer --compare-eager --batches 1,8,64 > "$OUT/bench-1.7b.log" 2>&1
grep -E "^ours(-eager)? decode" "$OUT/bench-1.7b.log" | sed 's/^/1.7b /' | tee -a "$S"
POLICY_SERVE_PROFILE_STEPS=100 RUST_LOG=warn,policy_serve::profile=info timeout 60 .gpu/bench --model-dir /tmp/m-0.6b --no-peer --batches 1,8,64 > "$OUT/profile-bench.log" 2>&1
grep -E "step profile" "$OUT/profile-bench.log" | sed 's/.*running=/running=/' | tee -a "$S"
for swap in 4 0; do
  SHAPE=0.6b N=64 AGENT=0 MAX_RUNNING=64 T1=150 LOAD_ARGS=--compare-unloaded SERVE_ARGS="--kv-cache-gib 0.5 --swap-gib $swap" PORT=1809$swap bash scripts/gpu_serve.sh 2>&1 | grep -vE "^\s*$|━|⠁" | tail -14 | tee -a "$S"
done
timeout 40 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,2 2>&1 | grep -v WARN > "$OUT/profile-ops.txt"
grep -E "ours|sum of|graph replay" "$OUT/profile-ops.txt" | tee -a "$S"
echo "==== summary"; cat "$S"
