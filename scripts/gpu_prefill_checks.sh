#!/usr/bin/env bash
# Second device call for #20: prefill numerics (our bf16 logits of the last 64 positions of a 2k
# and a 16k prompt against transformers in f32 math, beside torch bf16's own error, on a
# transformers-initialised 0.6B checkpoint), one 28k-token prompt over plain HTTP, and the agent
# workload's turn latency. Expects .gpu/{bench,serve,policy-serve}.xz.
set -u
source scripts/gpu_lib.sh
model 0.6b
timeout 120 python3 scripts/hf_init_model.py tests/fixtures/qwen3/config-0.6b.json /tmp/m-0.6b /tmp/hf-0.6b 2>&1 | tail -1 | tee -a "$S"
for n in 2048 16384; do
  python3 -c "import random; r=random.Random($n); print(','.join(['151644','8948','198']+[str(r.randrange(100000)) for _ in range($n-3)]))" > /tmp/ids-$n.txt
  timeout 150 .gpu/policy-serve logits --model-dir /tmp/hf-0.6b --ids "$(cat /tmp/ids-$n.txt)" --last 64 --out /tmp/ours-$n.npy --device cuda --dtype bf16 2>&1 | tail -1
  LAST=64 timeout 150 python3 scripts/hf_logits_check.py /tmp/hf-0.6b @/tmp/ids-$n.txt ours-bf16=/tmp/ours-$n.npy 2>&1 | grep hf-check | sed "s/^/P=$n /" | tee -a "$S"
done
.gpu/serve --addr 127.0.0.1:18080 --device cuda --models m --model-dir m=/tmp/m-0.6b --max-body-bytes 4000000 > "$OUT/serve.log" 2>&1 &
pid=$!
for i in $(seq 1 120); do
  code=$(curl -s -o /dev/null -w '%{http_code}' localhost:18080/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1}')
  [ "$code" = 200 ] && break; sleep 1
done
timeout 120 python3 scripts/http_long_prompt.py http://127.0.0.1:18080 m 27500 2>&1 | tee -a "$S"
kill $pid 2>/dev/null; wait $pid 2>/dev/null
for c in 2048 4096; do run 0.6b-32000-mixed-chunk$c --model-dir /tmp/m-0.6b --prompt 32000 --batches 16 --mixed --prefill-chunk $c; done
model 1.7b
run 1.7b-32000-chunk4096 --model-dir /tmp/m-1.7b --prompt 32000 --prefill-chunk 4096
model 8b
for p in 2048 8192 32000; do run 8b-$p --model-dir /tmp/m-8b --prompt $p; done
timeout 100 .gpu/bench --model-dir /tmp/m-0.6b --agent 64,10 --agent-only > "$OUT/agent.log" 2>&1
grep -iE "agent|turn" "$OUT/agent.log" | tail -6 | tee -a "$S"
