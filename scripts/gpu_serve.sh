#!/usr/bin/env bash
# On the H200: the HTTP host on a random model in a real Qwen3 shape, driven by
# examples/load.rs: N streamed chat completions (512 in / 128 out, all at once), then the agent
# workload through the episodes API. Expects .gpu/{bench,serve,load}.{xz,gz}.
#   LOAD_ARGS=--compare-unloaded INPUT_LEN=512 OUTPUT_LEN=128
#   SHAPE=0.6b|1.7b  N=500  AGENT=64,10  MODE=append_only|template  SERVE_ARGS=--no-prefix-cache
set -u
OUT=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh
shape=${SHAPE:-0.6b}
[ -d /tmp/m-$shape ] || .gpu/bench --config tests/fixtures/qwen3/config-$shape.json --write-model /tmp/m-$shape > /dev/null 2>&1
port=${PORT:-18080}
.gpu/serve --addr 127.0.0.1:$port --device cuda --models m --model-dir m=/tmp/m-$shape --max-running ${MAX_RUNNING:-512} \
  --max-tokens-cap 4096 --max-body-bytes 4000000 --max-episodes 4096 ${SERVE_ARGS:-} > "$OUT/serve-$shape-$port.log" 2>&1 &
pid=$!
for i in $(seq 1 120); do
  code=$(curl -s -o /dev/null -w '%{http_code}' localhost:$port/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1}')
  [ "$code" = 200 ] && break; sleep 1
done
grep "engine ready" "$OUT/serve-$shape-$port.log" | cut -c1-300
if [ "${N:-500}" != 0 ]; then
  timeout ${T1:-120} .gpu/load --base http://127.0.0.1:$port --model m --requests ${N:-500} --input-len ${INPUT_LEN:-512} --output-len ${OUTPUT_LEN:-128} ${LOAD_ARGS:-} 2>&1 | tee -a "$OUT/load-$shape.txt"
fi
if [ "${AGENT:-64,10}" != 0 ]; then
  timeout ${T2:-120} .gpu/load --base http://127.0.0.1:$port --model m --agent ${AGENT:-64,10} --transcript-mode ${MODE:-append_only} ${LOAD_EXTRA:-} 2>&1 | tee -a "$OUT/agent-$shape.txt"
fi
curl -s localhost:$port/metrics > "$OUT/metrics-$shape-$port.txt" 2>/dev/null
kill $pid 2>/dev/null; wait $pid 2>/dev/null
