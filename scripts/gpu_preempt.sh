#!/usr/bin/env bash
# Forced preemption through the HTTP host on the H200: a 0.5 GiB KV cache (292 blocks of the
# 0.6B shape) for 64 requests of 512 in / 128 out sent at once, greedy outputs compared with an
# unloaded run, preemption and swap counters from /metrics; with swap (4 GiB), then recompute.
# Expects .gpu/{bench,serve,load}.{xz,gz}.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for swap in 4 0; do
  SHAPE=0.6b N=64 AGENT=0 MAX_RUNNING=64 T1=150 LOAD_ARGS=--compare-unloaded \
    SERVE_ARGS="--kv-cache-gib 0.5 --swap-gib $swap" PORT=1809$swap bash scripts/gpu_serve.sh 2>&1 |
    grep -vE "^\s*$|━" | tail -14
done
