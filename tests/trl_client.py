#!/usr/bin/env python3
"""Drives the HTTP host with TRL's own `VLLMClient` (`trl.generation.vllm_client`, what
GRPOTrainer generates through), as tests/http/completions.rs runs it on the tiny model.

    python3 tests/trl_client.py http://127.0.0.1:PORT MODEL_DIR

TRL imports torch and vLLM at module level although `generate`, `chat`, `get_world_size`,
`get_server_info` and `reset_prefix_cache` use only `requests`: both are stubbed here (a vLLM
of a version TRL supports, with the names its module imports), and `trl.generation`'s package
init, which loads the whole vLLM generation backend, is skipped. Checks: shapes as TRL reads
them, prompt ids equal to transformers' tokenizer and `apply_chat_template`, seeded samples
reproducible, the server's logprobs mode.
"""
import importlib
import importlib.machinery
import os
import sys
import types

base, model_dir = sys.argv[1], sys.argv[2]


def stub(name, **attrs):
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


class _Anything:
    def __init__(self, *a, **k):
        pass


# torch: the names vllm_client evaluates at import (annotations, `from torch import nn`).
torch = stub("torch", device=type("device", (_Anything,), {}), Tensor=type("Tensor", (_Anything,), {}))
torch.nn = stub("torch.nn", Module=type("Module", (_Anything,), {}))
# vLLM 0.27: TRL's supported range, before its stateful trainer engine.
stub("vllm", __version__="0.27.0")
stub("vllm.utils")
stub("vllm.utils.network_utils", get_ip=lambda: "127.0.0.1")
stub("vllm.distributed")
stub("vllm.distributed.weight_transfer")
stub("vllm.distributed.weight_transfer.nccl_engine",
     NCCLTrainerSendWeightsArgs=_Anything, NCCLWeightTransferEngine=_Anything)

import trl  # noqa: E402

gen = types.ModuleType("trl.generation")
gen.__path__ = [os.path.join(os.path.dirname(trl.__file__), "generation")]
sys.modules["trl.generation"] = gen
from trl.generation.vllm_client import VLLMClient  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

client = VLLMClient(base_url=base, connection_timeout=60)
assert client.model == "tiny", client.model
assert client.get_world_size() == 1
assert client.get_server_info()["model_config"]["logprobs_mode"] == "processed_logprobs"
tok = AutoTokenizer.from_pretrained(model_dir)

# Token-id prompts, n samples, TRL's defaults (logprobs 0: the drawn token's own).
prompts = [[(i * 7919 + 1179) % 5000 + 100 for i in range(50)], [101, 102, 103, 104]]
out = client.generate(prompts, n=3, max_tokens=8, temperature=1.5,
                      generation_kwargs={"seed": 11, "min_tokens": 8})
assert out["prompt_ids"] == prompts, out["prompt_ids"]
assert len(out["completion_ids"]) == len(prompts) * 3
for ids, lps, lp_ids in zip(out["completion_ids"], out["logprobs"], out["logprob_token_ids"]):
    assert len(ids) == 8, ids
    assert len(lps) == 8 and all(len(p) == 1 and p[0] <= 0.0 for p in lps), lps
    assert lp_ids == [[t] for t in ids], (lp_ids, ids)

# Seeded samples repeat (on an empty prefix cache each time: see tests/http/completions.rs).
client.reset_prefix_cache()
a = client.generate(prompts[:1], n=4, max_tokens=6, temperature=1.5, top_p=1.0,
                    generation_kwargs={"seed": 3})["completion_ids"]
client.reset_prefix_cache()
b = client.generate(prompts[:1], n=4, max_tokens=6, temperature=1.5, top_p=1.0,
                    generation_kwargs={"seed": 3})["completion_ids"]
assert a == b, (a, b)

# Text prompts: the server's tokenization is transformers'.
texts = ["Count the rows of table users.", "SELECT name FROM t WHERE id = 3;"]
out = client.generate(texts, max_tokens=2, logprobs=2)
assert out["prompt_ids"] == [tok(t)["input_ids"] for t in texts], out["prompt_ids"]
assert all(len(p) in (2, 3) for seq in out["logprobs"] for p in seq), out["logprobs"]

# Chat: the prompt ids are transformers' apply_chat_template, with its kwargs.
conversations = [[{"role": "user", "content": "How many users are there?"}],
                 [{"role": "system", "content": "Answer in SQL."}, {"role": "user", "content": "Names?"}]]
for thinking in (False, True):
    out = client.chat(conversations, n=2, max_tokens=3, temperature=1.0,
                      chat_template_kwargs={"enable_thinking": thinking})
    for conv, ids in zip(conversations, out["prompt_ids"]):
        ref = tok.apply_chat_template(conv, add_generation_prompt=True, enable_thinking=thinking,
                                      tokenize=True)
        ref = ref["input_ids"] if isinstance(ref, dict) or hasattr(ref, "keys") else ref
        assert ids == list(ref), (thinking, ids, list(ref))
    assert len(out["completion_ids"]) == 4
    assert all(len(p) == len(c) for p, c in zip(out["logprobs"], out["completion_ids"]))
print("trl client ok")
