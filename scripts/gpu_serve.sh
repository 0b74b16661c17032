#!/usr/bin/env bash
# On the H200: the HTTP host on a random 0.6B-shape model, driven by examples/load.rs:
# 500 streamed chat completions (512 in / 128 out, all at once), then 64 agents x 10 turns
# through the episodes API. Expects .gpu/{bench,serve,load}.gz.
set -u
OUT=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for b in bench serve load; do gunzip -kf .gpu/$b.gz && chmod +x .gpu/$b; done
.gpu/bench --config tests/fixtures/qwen3/config-${SHAPE:-0.6b}.json --write-model /tmp/m > /dev/null 2>&1
.gpu/serve --addr 127.0.0.1:18080 --device cuda --model-dir m=/tmp/m --preload --max-running ${MAX_RUNNING:-512} \
  --max-tokens-cap 4096 --max-body-bytes 4000000 --max-episodes 4096 > "$OUT/serve.log" 2>&1 &
for i in $(seq 1 60); do curl -s localhost:18080/v1/models | grep -q '"loaded":true' && break; sleep 1; done
grep "engine ready" "$OUT/serve.log" | cut -c1-400
timeout ${T1:-120} .gpu/load --base http://127.0.0.1:18080 --model m --requests ${N:-500} --input-len 512 --output-len 128 2>&1 | tee "$OUT/load.txt"
timeout ${T2:-120} .gpu/load --base http://127.0.0.1:18080 --model m --agent ${AGENT:-64,10} 2>&1 | tee "$OUT/agent.txt"
kill %1 2>/dev/null
