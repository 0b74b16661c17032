#!/usr/bin/env bash
# On the GPU machine (#25, KV tiers). PART=resume: the time to first token of resuming one
# 8k / 32k-token transcript of the 1.7B shape from GPU, host, disk and by recompute
# (bench --tiers-resume), then decode tok/s of the 0.6B with the tiers on (nothing to move)
# and off in one script. PART=agent: the agent workload over HTTP (1.7B shape, E episodes x 10
# turns, tool results of ~650 tokens so transcripts grow to ~8k, 2 s think time, the GPU's KV
# cache a quarter of the live transcripts) with tiers on, then off (recompute).
# RESUME_VARIANTS: ';'-separated flag sets for more resume runs (e.g. "--kv-load-direct").
set -u
source scripts/gpu_lib.sh
part=${PART:-resume}
if [ "$part" = resume ]; then
  model 1.7b
  timeout 200 .gpu/bench --model-dir /tmp/m-1.7b --no-peer --tiers-resume ${LENS:-8192,32768} \
    > "$OUT/resume.log" 2>&1
  grep -E "^\||^#|rates|KV tiers|error" "$OUT/resume.log" | cut -c1-400 | tee -a "$S"
  IFS=';' read -ra rvs <<< "${RESUME_VARIANTS:-}"
  for v in "${rvs[@]}"; do
    timeout 200 .gpu/bench --model-dir /tmp/m-1.7b --no-peer --tiers-resume ${LENS:-8192,32768} $v \
      > "$OUT/resume-variant.log" 2>&1
    grep -E "^\||rates|error|warn" "$OUT/resume-variant.log" | cut -c1-400 | sed "s/^/[$v] /" | tee -a "$S"
  done
  model 0.6b
  for host in 4 0; do
    timeout 120 .gpu/bench --model-dir /tmp/m-0.6b --no-peer --batches ${BATCHES:-1,64,256} --new 128 \
      --prompt 256 --kv-host-gib $host > "$OUT/decode-host$host.log" 2>&1
    grep -E "^ours decode" "$OUT/decode-host$host.log" | sed "s/^/kv-host-gib $host: /" | tee -a "$S"
  done
else
  model 1.7b
  E=${E:-128}
  for tiers in ${TIERS:-on off}; do
    if [ $tiers = on ]; then
      args="--kv-host-gib ${HOST_GIB:-64} --kv-disk-dir /tmp/kvdisk --kv-disk-gib ${DISK_GIB:-40}"
    else
      args="--kv-host-gib 0"
    fi
    args="$args ${EXTRA:-}"
    rm -rf /tmp/kvdisk
    SHAPE=1.7b N=0 AGENT=$E,10 T2=${T2:-240} PORT=1818${#tiers} \
      SERVE_ARGS="--kv-cache-gib ${GPU_GIB:-30} $args" \
      LOAD_EXTRA="--think-ms 2000 --tool-result-words 500" bash scripts/gpu_serve.sh > "$OUT/agent-$tiers.txt" 2>&1
    grep -E "^agent|KV tier" "$OUT/agent-$tiers.txt" "$OUT"/serve-1.7b-1818${#tiers}.log | cut -c1-400 | sed "s/^/tiers $tiers: /" | tee -a "$S"
    grep -E "kv_tier|preempt|swap" "$OUT/metrics-1.7b-1818${#tiers}.txt" | grep -v "^#" | tee -a "$S"
  done
fi
