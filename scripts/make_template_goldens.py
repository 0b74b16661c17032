#!/usr/bin/env python3
"""Make the chat-template golden files with the real Hugging Face `transformers`.

Each case in tests/fixtures/chat_template/cases.json is rendered with
`tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=...,
enable_thinking=..., tokenize=False)` using the Qwen3 tokenizer files in
tests/fixtures/qwen3/, and written to tests/fixtures/chat_template/<name>.txt.
The Rust test `tests/format_template.rs` renders the same cases and compares byte for byte.

    pip install transformers jinja2   # no torch needed
    python3 scripts/make_template_goldens.py
"""
import json
import pathlib

from transformers import AutoTokenizer, __version__

root = pathlib.Path(__file__).resolve().parent.parent
fixtures = root / "tests" / "fixtures"
out = fixtures / "chat_template"
tok = AutoTokenizer.from_pretrained(str(fixtures / "qwen3"))
cases = json.loads((out / "cases.json").read_text(encoding="utf-8"))
for case in cases:
    kwargs = {"tokenize": False, "add_generation_prompt": case.get("add_generation_prompt", True)}
    if "tools" in case:
        kwargs["tools"] = case["tools"]
    if "enable_thinking" in case:
        kwargs["enable_thinking"] = case["enable_thinking"]
    text = tok.apply_chat_template(case["messages"], **kwargs)
    (out / f"{case['name']}.txt").write_text(text, encoding="utf-8", newline="")
print(f"wrote {len(cases)} goldens with transformers {__version__}")
