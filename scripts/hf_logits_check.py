#!/usr/bin/env python3
"""Our logits (.npy files from `policy-serve logits`) against HF transformers' Qwen3 on the same
checkpoint. The reference is torch in f32 math on the checkpoint's (bf16) weights; torch's own
bf16 inference is measured against the same reference, so the two errors sit side by side.
Runs on the GPU machine (torch + transformers there).

    python3 scripts/hf_logits_check.py MODEL_DIR IDS NAME=OURS.npy [NAME=OURS.npy ...]

IDS is a comma list or @FILE (a file holding the comma list); LAST=N in the environment
compares the last N positions only (long prompts; `policy-serve logits --last N`). REQUIRE=1
exits non-zero unless every bf16 run of ours (a NAME containing "bf16") has a relative error
at most torch-bf16's and an argmax agreement at least torch-bf16's minus one point (#21).
"""
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

model_dir, ids_arg = sys.argv[1], sys.argv[2]
if ids_arg.startswith("@"):
    ids_arg = open(ids_arg[1:]).read().strip()
ids = [int(x) for x in ids_arg.split(",")]
last = int(os.environ.get("LAST", "0")) or len(ids)
ours = dict(a.split("=", 1) for a in sys.argv[3:])


def logits(dtype):
    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype).cuda().eval()
    with torch.no_grad():
        out = m(torch.tensor([ids]).cuda(), logits_to_keep=last).logits[0].float().cpu().numpy()
    del m
    torch.cuda.empty_cache()
    return out


ref = logits(torch.float32)
runs = {"torch-bf16": logits(torch.bfloat16)}
for name, path in ours.items():
    runs[name] = np.load(path)
scale = np.abs(ref).max()
failed = []
for name, x in runs.items():
    assert x.shape == ref.shape, (name, x.shape, ref.shape)
    d = np.abs(x - ref)
    agree = (x.argmax(-1) == ref.argmax(-1)).mean()
    agree_t = (x.argmax(-1) == runs["torch-bf16"].argmax(-1)).mean()
    dt = np.abs(x - runs["torch-bf16"]).max() / np.abs(runs["torch-bf16"]).max()
    print(f"hf-check {name:>10} vs torch-f32: positions {last} of {len(ids)} rel {d.max() / scale:.2e} "
          f"mean_abs {d.mean():.5f} argmax_agree {agree:.3f}; vs torch-bf16: rel {dt:.2e} argmax_agree {agree_t:.3f}")
    if name == "torch-bf16":
        torch_rel, torch_agree = d.max() / scale, agree
    elif "bf16" in name and (d.max() / scale > torch_rel or agree < torch_agree - 0.01):
        failed.append(name)
if os.environ.get("REQUIRE"):
    print(f"hf-check {'FAIL ' + ', '.join(failed) if failed else 'PASS'}: bf16 rel <= torch-bf16's, "
          f"argmax agreement >= torch-bf16's - 1 point")
    sys.exit(1 if failed else 0)
