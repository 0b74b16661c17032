#!/usr/bin/env python3
"""Compare our logits (.npy from `policy-serve logits`) with HF transformers' Qwen3 on the same
checkpoint. Runs on the GPU machine (torch + transformers there).

    python3 scripts/hf_logits_check.py MODEL_DIR IDS OURS.npy DTYPE   # DTYPE: float32 | bfloat16
"""
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

model_dir, ids, ours_path, dtype = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ids = [int(x) for x in ids.split(",")]
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=getattr(torch, dtype)).cuda().eval()
with torch.no_grad():
    ref = model(torch.tensor([ids]).cuda()).logits[0].float().cpu().numpy()
ours = np.load(ours_path)
assert ours.shape == ref.shape, (ours.shape, ref.shape)
diff = np.abs(ours - ref)
scale = np.abs(ref).max()
agree = (ours.argmax(-1) == ref.argmax(-1)).mean()
print(f"hf-check {dtype}: positions {len(ids)} max_abs_diff {diff.max():.5f} max|logit| {scale:.2f} rel {diff.max() / scale:.2e} mean_abs_diff {diff.mean():.5f} argmax_agree {agree:.3f}")
