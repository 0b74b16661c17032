#!/usr/bin/env python3
"""A plain client of another project's making: Python's http.client (urllib's), one thread per
request, no streaming, every request sent at once (as a user's quick script would). Sends the lines of
PROMPT_FILE as chat completions with the body `examples/load.rs` sends (greedy, `max_tokens` =
`min_tokens` = OUTPUT_LEN, `ignore_eos`), so its numbers sit beside the load tool's streamed and
`--no-stream` runs of the same prompts. Prints output tok/s and E2E p50/p99, and E2E in parts:
connecting, request to reply, and how late each thread started.

    python3 scripts/http_plain_client.py BASE MODEL PROMPT_FILE [OUTPUT_LEN]
    python3 scripts/http_plain_client.py --write-prompts FILE N WORDS [SEED]  # random words
"""
import json
import random
import sys
import threading
import time
import http.client
import urllib.parse

if sys.argv[1] == "--write-prompts":
    path, n, words = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(int(sys.argv[5]) if len(sys.argv) > 5 else 0)
    vocab = ["alpha", "table", "query", "river", "orange", "select", "window", "metric",
             "planet", "signal", "column", "vector", "garden", "silver", "engine", "number"]
    with open(path, "w") as f:
        for _ in range(n):
            f.write(" ".join(rng.choice(vocab) for _ in range(words)) + "\n")
    sys.exit(0)

base, model, prompt_file = sys.argv[1:4]
out_len = int(sys.argv[4]) if len(sys.argv) > 4 else 128
prompts = [l.rstrip("\n") for l in open(prompt_file) if l.strip()]
results = [None] * len(prompts)


def one(i, prompt):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": out_len, "min_tokens": out_len, "ignore_eos": True,
                       "temperature": 0}).encode()
    t0 = time.perf_counter()
    try:
        # http.client (what urllib runs on), so that connecting is timed apart from serving.
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
        conn.connect()
        t1 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        reply = json.loads(conn.getresponse().read())
        conn.close()
        t2 = time.perf_counter()
        results[i] = (t2 - t0, reply["usage"]["completion_tokens"], t1 - t0, t2 - t1, t0 - start)
    except Exception as e:  # a failure is counted, not fatal
        results[i] = (time.perf_counter() - t0, None, 0, 0, 0)
        print(f"request {i} failed: {e}", file=sys.stderr)


url = urllib.parse.urlparse(base)
start = time.perf_counter()
threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - start
good = [r for r in results if r[1] is not None]
toks = sum(r[1] for r in good)


def pct(col, q):
    v = sorted(r[col] for r in good)
    return v[min(len(v) - 1, int(q * len(v)))] * 1e3 if v else float("nan")


print(f"python-urllib non-streamed: {len(good)}/{len(prompts)} ok in {wall:.2f} s, "
      f"output {toks / wall:.0f} tok/s, E2E p50 {pct(0, 0.5):.0f} ms p99 {pct(0, 0.99):.0f} ms")
print(f"python-urllib parts (p50 / p99 ms): connect {pct(2, 0.5):.0f} / {pct(2, 0.99):.0f}, "
      f"request to reply {pct(3, 0.5):.0f} / {pct(3, 0.99):.0f}, "
      f"thread started after {pct(4, 0.5):.0f} / {pct(4, 0.99):.0f}")
