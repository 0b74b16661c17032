#!/usr/bin/env bash
# On the GPU machine (#26): constrained answers through the HTTP host on the device path
# (mask kernel, argmax / whole-vocabulary / top-k draws over masked logits).
set -u
source scripts/gpu_lib.sh
model ${SHAPE:-0.6b}
.gpu/serve --addr 127.0.0.1:18500 --device cuda --models m --model-dir m=/tmp/m-${SHAPE:-0.6b} \
  --max-tokens-cap 4096 > "$OUT/serve.log" 2>&1 &
pid=$!
for i in $(seq 1 120); do curl -s localhost:18500/server_info | grep -q '"loaded":true' && break; sleep 1; done
timeout 400 python3 scripts/constrained_http.py http://127.0.0.1:18500 m 2>&1 | tee -a "$S"
kill $pid; wait $pid 2>/dev/null
