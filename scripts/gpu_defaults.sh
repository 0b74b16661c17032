#!/usr/bin/env bash
# On the GPU machine (#21): serving defaults. Decode tok/s at batch 1, 8, 64, 256, 512 per shape
# (SHAPES, default 0.6b 1.7b; BENCH_ARGS added), batch 512 again with graphs up to 512
# (GRAPH512=1; SHAPES= for none); then (HTTP=1) the HTTP host with default flags on 0.6B: N (500) chat requests
# of ~490 random words, OUTPUT_LEN (128) tokens each, all at once, three ways on fresh prompts
# each (no prefix-cache hits): the load tool streamed, the load tool --no-stream, and a Python
# urllib client (one thread per request, non-streamed).
set -u
source scripts/gpu_lib.sh
for shape in ${SHAPES-0.6b 1.7b}; do
  model $shape
  echo "== bench $shape defaults" | tee -a "$S"
  timeout 200 .gpu/bench --no-peer --model-dir /tmp/m-$shape --batches ${BATCHES:-1,8,64,256,512} ${BENCH_ARGS:-} > "$OUT/bench-$shape.log" 2>&1
  grep -E "^ours|^# engine" "$OUT/bench-$shape.log" | tee -a "$S"
  if [ -n "${GRAPH512:-}" ]; then
    echo "== bench $shape batch 512, graphs to 512" | tee -a "$S"
    timeout 120 .gpu/bench --no-peer --model-dir /tmp/m-$shape --batches 512 --max-graph-batch 512 ${BENCH_ARGS:-} > "$OUT/bench-$shape-g512.log" 2>&1
    grep -E "^ours|^# engine" "$OUT/bench-$shape-g512.log" | tee -a "$S"
  fi
done
[ -z "${HTTP:-}" ] && exit 0
model 0.6b
port=18090
.gpu/serve --addr 127.0.0.1:$port --device cuda --models m --model-dir m=/tmp/m-0.6b \
  --max-tokens-cap 4096 --max-body-bytes 4000000 ${SERVE_ARGS:-} > "$OUT/serve-defaults.log" 2>&1 &
pid=$!
for i in $(seq 1 120); do
  code=$(curl -s -o /dev/null -w '%{http_code}' localhost:$port/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1}')
  [ "$code" = 200 ] && break; sleep 1
done
grep "engine ready" "$OUT/serve-defaults.log" | cut -c1-400 | tee -a "$S"
N=${N:-500}; OL=${OUTPUT_LEN:-128}
for seed in 1 2 3; do python3 scripts/http_plain_client.py --write-prompts /tmp/p$seed.txt $N 490 $seed; done
echo "== HTTP defaults, $N requests, $OL out; somaxconn $(cat /proc/sys/net/core/somaxconn)" | tee -a "$S"
# The kernel's count of connections refused for a full accept queue (SYN retried a second later).
overflows() { awk '/^TcpExt:/ { if (!h) { for (i = 1; i <= NF; i++) n[$i] = i; h = 1 } else print $n["ListenOverflows"] }' /proc/net/netstat; }
before=$(overflows)
timeout 120 .gpu/load --base http://127.0.0.1:$port --model m --requests $N --prompt-file /tmp/p1.txt --output-len $OL 2>&1 | tail -6 | sed 's/^/streamed /' | tee -a "$S"
timeout 120 .gpu/load --base http://127.0.0.1:$port --model m --requests $N --prompt-file /tmp/p2.txt --output-len $OL --no-stream 2>&1 | tail -6 | sed 's/^/no-stream /' | tee -a "$S"
timeout 120 python3 scripts/http_plain_client.py http://127.0.0.1:$port m /tmp/p3.txt $OL 2>&1 | tail -3 | tee -a "$S"
echo "listen-queue overflows during the three runs: $(( $(overflows) - before ))" | tee -a "$S"
kill $pid 2>/dev/null; wait $pid 2>/dev/null
