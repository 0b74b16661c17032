#!/usr/bin/env bash
# On the GPU machine (#24): greedy decode through the HTTP host with and without n-gram
# speculation (scripts/spec_load.py: self-repeating prompts, batch 1 and 8, 256 tokens):
# tok/s, acceptance from /metrics, and whether the answers are token for token equal.
# Modes: plain (--speculative-method none), spec (n-gram, K drafts, no backoff flag given:
# the default backoff), default (no speculative flag at all: the engine's defaults).
set -u
source scripts/gpu_lib.sh
shape=${SHAPE:-0.6b}
model $shape
for mode in ${MODES:-plain spec}; do
  extra="--speculative-method none"
  [ $mode = spec ] && extra="--speculative-method ngram --num-speculative-tokens ${K:-4}"
  [ $mode = default ] && extra=""
  .gpu/serve --addr 127.0.0.1:18400 --device cuda --models m --model-dir m=/tmp/m-$shape \
    --max-tokens-cap 4096 $extra > "$OUT/serve-$mode.log" 2>&1 &
  pid=$!
  for i in $(seq 1 120); do curl -s localhost:18400/server_info | grep -q '"loaded":true' && break; sleep 1; done
  echo "== $shape $mode $extra" | tee -a "$S"
  timeout 300 python3 scripts/spec_load.py http://127.0.0.1:18400 m "$OUT/answers-$mode.json" ${BATCHES:-1,8} 2>&1 | tee -a "$S"
  curl -s localhost:18400/metrics | grep -E "^policy_serve_spec" | tee -a "$S"
  kill $pid; wait $pid 2>/dev/null
done
for mode in ${MODES:-plain spec}; do
[ $mode = plain ] && continue
python3 - "$OUT" $mode <<'PY' | tee -a "$S"
import json, sys
a = json.load(open(f"{sys.argv[1]}/answers-plain.json")); b = json.load(open(f"{sys.argv[1]}/answers-{sys.argv[2]}.json"))
lp = [k for k in a if k.endswith("-lp")]
worst = max((abs(p - q) for k in lp for x, y in zip(a[k], b[k]) for p, q in zip(x, y)), default=0.0)
print(f"{sys.argv[2]}: log-probs with and without speculation: {len(lp)} rounds, max abs difference {worst:.2e}")
a = {k: v for k, v in a.items() if k not in lp}
same = sum(x == y for k in a for x, y in zip(a[k], b[k])); n = sum(len(a[k]) for k in a)
first = [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None) for k in a for x, y in zip(a[k], b[k])]
print(f"{sys.argv[2]}: greedy answers equal with and without speculation: {same}/{n}; first difference at {[f for f in first if f is not None][:8]}")
PY
done
