#!/usr/bin/env python3
"""A checkpoint as a transformers user would make one: `Qwen3ForCausalLM(config)` (or
`Qwen3MoeForCausalLM` for a `qwen3_moe` config) with
transformers' own init (`torch.manual_seed(0)`: normal std 0.02, norms 1.0), saved by
`save_pretrained` in bf16, plus the tokenizer files of TOKENIZER_DIR. Runs on the GPU machine.

    python3 scripts/hf_init_model.py CONFIG_JSON TOKENIZER_DIR OUT_DIR
"""
import shutil
import sys
from pathlib import Path

import torch
import json

from transformers import AutoConfig, AutoModelForCausalLM

config_path, tok_dir, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
torch.manual_seed(0)
raw = json.load(open(config_path))
for k in ("architectures", "transformers_version", "torch_dtype"):
    raw.pop(k, None)
model_type = raw.pop("model_type")
try:
    cfg = AutoConfig.for_model(model_type, **raw)
except Exception:  # older/newer transformers without for_model
    from transformers import CONFIG_MAPPING
    cfg = CONFIG_MAPPING[model_type](**raw)
# Initialised on the GPU when there is one (seconds instead of a minute for 1.7B on the CPU).
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
model.save_pretrained(out)
for f in tok_dir.iterdir():
    if f.name.startswith("tokenizer") or f.name in ("vocab.json", "merges.txt"):
        shutil.copy(f, out / f.name)
print(f"hf-init: wrote {out}")
