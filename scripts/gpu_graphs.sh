#!/usr/bin/env bash
# One device call for the decode step (issue #13): kernel checks (the fused decode attention
# bit for bit against the unfused kernels), the graph checks, decode tok/s graphs vs eager
# (0.6B, 1.7B), the attribution runs (fused attention off, clusters off, PDL in graphs off,
# pipelined decode on) and the op profile. Expects .gpu/{bench,graph_check,kernel_check}.xz (scripts/gpu_unpack.sh).
# Env: BATCHES_0_6B, BATCHES_1_7B (decode batch sizes of the bench per shape).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; S="$OUT/summary.txt"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$S"
for c in 0.6b 1.7b; do [ -d /tmp/m-$c ] || .gpu/bench --config tests/fixtures/qwen3/config-$c.json --write-model /tmp/m-$c > /dev/null 2>&1; done
t0=$(date +%s)
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b > "$OUT/kernel_check.log" 2>&1; echo "kernel_check exit $? ($(( $(date +%s) - t0 )) s)" | tee -a "$S"
grep -E "FAIL|kernel-check|decode_fused.*out" "$OUT/kernel_check.log" | tee -a "$S"
bench() { # name, env..., -- bench args (engine switches are bench flags, e.g. --no-fused-decode)
  local name=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" timeout 90 .gpu/bench --no-peer "$@" > "$OUT/bench-$name.log" 2>&1
  grep -E "^ours(-eager)? decode" "$OUT/bench-$name.log" | sed "s/^/$name /" | tee -a "$S"
}
bench 0.6b X=1 -- --model-dir /tmp/m-0.6b --compare-eager --batches ${BATCHES_0_6B:-1,2,4,8,16,64,256}
bench 0.6b-unfused X=1 -- --model-dir /tmp/m-0.6b --batches 1,8 --no-fused-decode
bench 0.6b-noclusters X=1 -- --model-dir /tmp/m-0.6b --batches 1,8,16 --no-clusters
bench 0.6b-nographpdl X=1 -- --model-dir /tmp/m-0.6b --batches 1,8 --no-graph-pdl
# Pipelined decode (each step launched before the previous step's tokens are read), and the
# step profile's GPU idle time per step with it off and on.
bench 0.6b-unpipelined X=1 -- --model-dir /tmp/m-0.6b --batches 1,8 --no-pipelined-decode
for p in 0 1; do
  pf=--no-pipelined-decode; [ "$p" = 1 ] && pf=""
  RUST_LOG=policy_serve::profile=info \
    timeout 90 .gpu/bench --no-peer --model-dir /tmp/m-0.6b --batches 1,8 --profile-steps 200 $pf 2>&1 \
    | grep -E "step profile" | tail -4 | sed "s/^/profile pipelined=$p /" | tee -a "$S"
done
bench 1.7b X=1 -- --model-dir /tmp/m-1.7b --compare-eager --batches ${BATCHES_1_7B:-1,8,64}
timeout 60 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,4,8 2>&1 | grep -v WARN > "$OUT/profile-ops.txt"
grep -E "^\||sum of|graph replay" "$OUT/profile-ops.txt" | tee -a "$S"
timeout 60 .gpu/graph_check --model-dir /tmp/m-1.7b --profile 1 2>&1 | grep -v WARN > "$OUT/profile-ops-1.7b.txt"
grep -E "^\||sum of|graph replay" "$OUT/profile-ops-1.7b.txt" | sed 's/^/1.7b /' | tee -a "$S"
t0=$(date +%s)
timeout 200 .gpu/graph_check --model-dir /tmp/m-0.6b > "$OUT/graph_check.log" 2>&1; echo "graph_check exit $? ($(( $(date +%s) - t0 )) s)" | tee -a "$S"
grep -v WARN "$OUT/graph_check.log" | tail -40 >> "$S"
rm -f "$OUT"/profile-ops*.txt
echo "==== summary"; cat "$S"
