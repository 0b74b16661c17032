#!/usr/bin/env bash
# One device call for the CUDA-graph round: scripts/gpu_graphs.sh (kernel checks, graph
# checks, decode graphs on vs off, attribution runs, op profile), then the HTTP load run
# (500 x 512/128) and the agent workload. Expects .gpu/{bench,graph_check,kernel_check,serve,load}.xz.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; S="$OUT/summary.txt"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh
bash scripts/gpu_graphs.sh > /dev/null
SHAPE=0.6b N=500 AGENT=64,10 T1=60 T2=60 bash scripts/gpu_serve.sh 2>&1 | grep -vE "^\s*$|━" | grep -E "engine ready|throughput|TTFT|TPOT|E2E|success|cache|latency|turn" | cut -c1-250 | tee -a "$S"
echo "==== summary"; cat "$S"
