#!/usr/bin/env python3
"""Drives examples/serve.rs with the official `openai` Python client (run by tests/http.rs).

    python3 tests/openai_client.py http://127.0.0.1:PORT [MODEL_KEY ...]
"""
import json
import sys

from openai import OpenAI

base, keys = sys.argv[1], sys.argv[2:] or ["demo"]
client = OpenAI(base_url=base + "/v1", api_key="unused")
tools = [
    {"type": "function", "function": {"name": "query", "description": "Run SQL", "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]}}},
    {"type": "function", "function": {"name": "answer", "description": "Answer", "parameters": {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}}},
]
messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "How many users?"}]

listed = [m.id for m in client.models.list().data]
assert "demo" in listed, listed
for key in keys:
    r = client.chat.completions.create(model=key, messages=messages, tools=tools, max_tokens=16, temperature=0)
    choice = r.choices[0]
    assert r.usage.prompt_tokens >= 0 and r.usage.completion_tokens >= 0
    if key == "demo":
        assert choice.finish_reason == "tool_calls", choice
        call = choice.message.tool_calls[0]
        assert call.function.name == "query" and "sql" in json.loads(call.function.arguments)
    else:
        assert choice.finish_reason in ("stop", "length", "tool_calls"), choice
        assert r.usage.prompt_tokens_details.cached_tokens is not None

    stream = client.chat.completions.create(model=key, messages=messages, tools=tools, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    finish, names, text, usage = None, [], "", None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            finish = c.finish_reason or finish
            text += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
    assert finish is not None and usage is not None, (finish, usage)
    if key == "demo":
        assert names == ["query"], names
print("openai client ok:", ", ".join(keys))
