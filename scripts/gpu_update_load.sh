#!/usr/bin/env bash
# On the GPU machine (#23): a weight update from disk asked in the middle of the GRPO-shaped
# load (scripts/grpo_load.py), with the server's step profile on and timestamps on every line,
# to see where the time of the pass that takes the update goes. SHAPE (default 0.6b).
set -u
source scripts/gpu_lib.sh
shape=${SHAPE:-0.6b}
model $shape
# COLD=1: the driver's compiled-kernel cache emptied first (a fresh machine's first start).
[ "${COLD:-0}" = 1 ] && rm -rf ~/.nv/ComputeCache
B=/tmp/hf-$shape
[ -d $B ] || python3 scripts/hf_init_model.py tests/fixtures/qwen3/config-$shape.json tests/fixtures/qwen3 $B > /dev/null 2>&1
.gpu/serve --addr 127.0.0.1:18300 --device cuda --models m --model-dir m=/tmp/m-$shape \
  --max-tokens-cap 4096 --max-body-bytes 67108864 --allow-weight-updates --profile-steps 20 \
  > "$OUT/serve-update-load.log" 2>&1 &
pid=$!
for i in $(seq 1 120); do curl -s localhost:18300/server_info | grep -q '"loaded":true' && break; sleep 1; done
ts() { while IFS= read -r l; do echo "$(date +%T.%N | cut -c1-12) $l"; done; }
for at in ${AT:-6 9}; do
  (timeout 200 python3 scripts/grpo_load.py http://127.0.0.1:18300 m 2>&1 | ts >> "$OUT/load-$at.log") &
  lp=$!
  sleep $at
  echo "$(date +%T.%N | cut -c1-12) update asked" >> "$OUT/load-$at.log"
  /usr/bin/time -f "update at ${at}s: %e s" curl -s -X POST localhost:18300/v1/models/m/weights \
    -H 'content-type: application/json' -d "{\"path\": \"$B\"}" > "$OUT/update-$at.json" 2> "$OUT/update-$at.time"
  echo "$(date +%T.%N | cut -c1-12) update answered: $(cat $OUT/update-$at.time) $(cat $OUT/update-$at.json)" >> "$OUT/load-$at.log"
  wait $lp
  cat "$OUT/load-$at.log" | tee -a "$S"
done
kill $pid; wait $pid 2>/dev/null
