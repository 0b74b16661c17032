#!/usr/bin/env python3
"""One long prompt over plain HTTP (urllib, no client library): a chat request whose user message
is N random common words, non-streaming with max_tokens 1 (the time to the first token over
HTTP) and streaming with max_tokens 16 (time to the first streamed token, end to end).

    python3 scripts/http_long_prompt.py BASE_URL MODEL N_WORDS
"""
import json
import random
import sys
import time
import urllib.request

base, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
words = ("the of and to in is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their has would when "
         "if so no will more can out some time only up into").split()
rng = random.Random(0)


def body(stream, max_tokens, salt):
    text = f"{salt} " + " ".join(rng.choice(words) for _ in range(n))
    return json.dumps({"model": model, "messages": [{"role": "user", "content": text}],
                       "max_tokens": max_tokens, "stream": stream}).encode()


def post(data):
    req = urllib.request.Request(base + "/v1/chat/completions", data=data,
                                 headers={"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


post(body(False, 1, "warm")).read()
t0 = time.perf_counter()
out = json.loads(post(body(False, 1, "a")).read())
t1 = time.perf_counter()
print(f"http-long non-streaming max_tokens 1: prompt_tokens {out['usage']['prompt_tokens']} "
      f"time {1e3 * (t1 - t0):.1f} ms", flush=True)
t0 = time.perf_counter()
first = None
with post(body(True, 16, "b")) as r:
    for line in r:
        if line.startswith(b"data:") and b"[DONE]" not in line:
            d = json.loads(line[5:])
            if first is None and d["choices"] and d["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
t1 = time.perf_counter()
print(f"http-long streaming max_tokens 16: first token {1e3 * ((first or t1) - t0):.1f} ms, "
      f"end to end {1e3 * (t1 - t0):.1f} ms", flush=True)
