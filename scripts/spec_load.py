#!/usr/bin/env python3
"""Greedy (or, with TEMPERATURE=T, seeded sampled) completions at batch B (B requests at once, one thread each) as an agent sends them:
a prompt that repeats itself (a 64-token unit four times, then its first half: tool calls copy
names from the prompt), 256 new tokens, `ignore_eos`. Prints tok/s per batch and writes the
token ids to OUT_JSON (to compare two servers' answers).

    python3 scripts/spec_load.py BASE MODEL OUT_JSON [BATCHES]
"""
import json
import os
import random
import sys
import threading
import time
import urllib.request

base, model, out = sys.argv[1], sys.argv[2], sys.argv[3]
batches = [int(b) for b in (sys.argv[4] if len(sys.argv) > 4 else "1,8").split(",")]
rng = random.Random(0)
answers = {}
logprobs = {}


def prompt(i):
    unit = [rng.randrange(100, 150000) for _ in range(64)]
    return unit * 4 + unit[:32]


def ask(p, box, k):
    body = {"model": model, "prompt": p, "max_tokens": 256, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    if os.environ.get("TEMPERATURE"):  # seeded sampling: the same seed per prompt either way
        body["temperature"] = float(os.environ["TEMPERATURE"])
        body["seed"] = 1000 + k
    if os.environ.get("LOGPROBS"):
        body["logprobs"] = int(os.environ["LOGPROBS"])
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        c = json.loads(r.read())["choices"][0]
        box[k] = c["token_ids"]
        if c.get("logprobs"):
            logprobs[k] = c["logprobs"]["token_logprobs"]


for b in batches:
    for rep in range(2):  # the first is a warm-up
        prompts = [prompt(i) for i in range(b)]
        box = {}
        ts = [threading.Thread(target=ask, args=(p, box, k)) for k, p in enumerate(prompts)]
        t = time.perf_counter()
        [x.start() for x in ts]
        [x.join() for x in ts]
        dt = time.perf_counter() - t
        toks = sum(len(v) for v in box.values())
        if rep == 1:
            print(f"batch {b}: {toks / dt:.0f} tok/s ({dt:.2f} s, {toks} tokens)", flush=True)
        answers[f"{b}-{rep}"] = [box[k] for k in range(b)]
        if logprobs:
            answers[f"{b}-{rep}-lp"] = [logprobs[k] for k in range(b)]
            logprobs.clear()
json.dump(answers, open(out, "w"))
