#!/usr/bin/env python3
"""transformers' prefill on the GPU machine: one forward of P random tokens (SDPA attention,
bf16, random init in the config's shape, only the last position's logits), best of 3 after a
warm-up, for each P; and 8 sequences of 8k in one forward. The reference rows of BENCHMARKS.md's
prefill table.

    python3 scripts/hf_prefill_bench.py CONFIG_JSON P[,P...]
"""
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

cfg = Qwen3Config.from_json_file(sys.argv[1])
cfg._attn_implementation = "sdpa"
lengths = [int(x) for x in sys.argv[2].split(",")]
torch.manual_seed(0)
with torch.device("cuda"):
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
name = sys.argv[1].rsplit("config-", 1)[-1].removesuffix(".json")


def timed(batch, p):
    ids = torch.randint(0, 100_000, (batch, p), device="cuda")
    best = float("inf")
    with torch.no_grad():
        for i in range(4):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(ids, logits_to_keep=1, use_cache=False)
            torch.cuda.synchronize()
            if i > 0:
                best = min(best, time.perf_counter() - t0)
    return best


for p in lengths:
    s = timed(1, p)
    print(f"hf-prefill {name} P={p}: {s * 1e3:.1f} ms ({p / s:.0f} tok/s)", flush=True)
s = timed(8, 8192)
print(f"hf-prefill {name} 8x8192: {s * 1e3:.1f} ms ({8 * 8192 / s:.0f} tok/s)", flush=True)
