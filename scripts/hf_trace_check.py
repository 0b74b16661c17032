#!/usr/bin/env python3
"""Where our bf16 error comes from: per-layer states of our kernel forward (`kernel_check
--trace-ids`, an .npz) against HF transformers' Qwen3 on the same checkpoint, in f32 math (the
reference) and in bf16 (torch's own error, side by side). Per layer: the attention output (o
projection), the MLP output (down projection) and the residual stream after the layer; then
the final norm and the logits. Columns: relative error (max |x - ref| / max |ref|) of ours and
of torch-bf16 against the f32 reference, and their ratio. Runs on the GPU machine.

    python3 scripts/hf_trace_check.py MODEL_DIR IDS_FILE OURS.npz
"""
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

model_dir, ids_file, ours_path = sys.argv[1:4]
ids = [int(x) for x in open(ids_file).read().strip().split(",")]
ours = np.load(ours_path)


def states(dtype):
    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype).cuda().eval()
    got = {}

    def hook(name):
        def f(_mod, _inp, out):
            o = out[0] if isinstance(out, tuple) else out
            got[name] = o[0].float().cpu().numpy()
        return f

    for i, layer in enumerate(m.model.layers):
        layer.self_attn.register_forward_hook(hook(f"attn.{i}"))
        layer.mlp.register_forward_hook(hook(f"mlp.{i}"))
    with torch.no_grad():
        out = m(torch.tensor([ids]).cuda(), output_hidden_states=True)
    hs = out.hidden_states
    for i in range(len(m.model.layers)):
        # hidden_states[i + 1] is the stream after layer i, except the last (after the norm).
        if i + 1 < len(hs) - 1:
            got[f"resid.{i}"] = hs[i + 1][0].float().cpu().numpy()
    got["norm"] = hs[-1][0].float().cpu().numpy()
    got["logits"] = out.logits[0].float().cpu().numpy()
    del m
    torch.cuda.empty_cache()
    return got


ref = states(torch.float32)
tb = states(torch.bfloat16)


def rel(x, r):
    return np.abs(x - r).max() / max(np.abs(r).max(), 1e-12)


print(f"trace: {len(ids)} tokens; rel err vs torch-f32: ours, torch-bf16, ratio")
for name in ours.files:
    if name not in ref:
        continue
    a, b = rel(ours[name], ref[name]), rel(tb[name], ref[name])
    extra = ""
    if name == "logits":
        agree = (ours[name].argmax(-1) == ref[name].argmax(-1)).mean()
        agree_t = (tb[name].argmax(-1) == ref[name].argmax(-1)).mean()
        extra = f" argmax_agree ours {agree:.3f} torch-bf16 {agree_t:.3f}"
    print(f"trace {name:>10} ours {a:.2e} torch-bf16 {b:.2e} ratio {a / max(b, 1e-12):.2f}{extra}")
