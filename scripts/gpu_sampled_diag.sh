#!/usr/bin/env bash
# On the GPU machine: sampled requests' speed over HTTP by sampling parameters (a top-p-only
# draw over the whole vocabulary read logits to the host), pipelined decode on and off.
set -u
source scripts/gpu_lib.sh
model 0.6b
for flags in "" "--no-pipelined-decode"; do
echo "== serve $flags" | tee -a "$S"
.gpu/serve --addr 127.0.0.1:18400 --device cuda --models m --model-dir m=/tmp/m-0.6b --profile-steps 16 $flags > "$OUT/serve.log" 2>&1 &
pid=$!
for i in $(seq 1 120); do curl -s localhost:18400/server_info | grep -q '"loaded":true' && break; sleep 1; done
python3 - <<'PY' 2>&1 | tee -a "$S"
import json, time, urllib.request
def ask(extra):
    body = {"model": "m", "prompt": list(range(1000, 1300)), "max_tokens": 32, "ignore_eos": True, "return_token_ids": True}
    body.update(extra)
    req = urllib.request.Request("http://127.0.0.1:18400/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=100) as r:
        c = json.loads(r.read())["choices"][0]
    print(f"{extra}: {time.perf_counter()-t:.3f} s for {len(c['token_ids'])} tokens", flush=True)
for extra in [{"temperature": 0}, {"temperature": 0.3, "top_p": 1.0, "top_k": -1}, {"temperature": 0.3}, {"temperature": 0.3, "top_k": -1, "top_p": 0.95}, {"temperature": 0.3, "top_k": 100}]:
    try:
        ask(extra)
    except Exception as e:
        print(extra, "failed", e, flush=True)
PY
kill $pid; wait $pid 2>/dev/null
grep -iE "step profile" "$OUT/serve.log" | tail -6 | cut -c1-330 | tee -a "$S"
done
