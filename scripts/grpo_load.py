#!/usr/bin/env python3
"""A GRPO-shaped generation load, sent as TRL's VLLMClient.generate sends it: one
POST /v1/completions with P token-id prompts x n samples (default 64 x 8, 512 in / 256 out,
temperature 1.0, logprobs 0, return_token_ids), timed end to end; repeated with logprobs off
(LOGPROBS=none) to show what the log-probs cost. Prints generated tok/s.

    python3 scripts/grpo_load.py BASE MODEL [PROMPTS N IN OUT]
"""
import json
import os
import random
import sys
import time
import urllib.request

base, model = sys.argv[1], sys.argv[2]
P, N, IN, OUT = (int(x) for x in (sys.argv[3:7] or [64, 8, 512, 256]))
rng = random.Random(int(os.environ.get("SEED", "0")))


def run(logprobs):
    prompts = [[rng.randrange(100, 150000) for _ in range(IN)] for _ in range(P)]
    body = {"model": model, "prompt": prompts, "n": N, "max_tokens": OUT, "min_tokens": OUT,
            "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "seed": 1}
    if logprobs is not None:
        body["logprobs"] = logprobs
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        reply = json.loads(r.read())
    dt = time.perf_counter() - t
    toks = sum(len(c["token_ids"]) for c in reply["choices"])
    cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    print(f"grpo {P}x{N} {IN} in/{OUT} out logprobs={logprobs}: {dt:.2f} s, {toks / dt:.0f} generated tok/s, "
          f"{len(reply['choices'])} choices, prompt tokens cached {cached}")


run(None)  # warm-up (graphs, allocator)
for lp in (0, None, 0):
    run(lp)
