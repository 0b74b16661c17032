"""Constrained answers through the HTTP host on the GPU (#26): tool_choice required / named /
response_format json_schema, greedy, whole-vocabulary draws and device top-k draws; every
answer must hold calls of the request's tools with well-formed arguments (checked here, not by
the grammar engine). Usage: constrained_http.py BASE MODEL"""
import json, sys, urllib.request

base, model = sys.argv[1], sys.argv[2]
tools = json.load(open("tests/fixtures/tools/nested.json"))
enums = {"table": {"users", "orders", "items"}}

def post(body):
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))

def check_call(name, args):
    if name == "query":
        assert args["table"] in enums["table"] and 1 <= len(args["columns"]) <= 3, args
        assert all(c in {"id", "name", "price"} for c in args["columns"]), args
        assert "limit" not in args or 1 <= args["limit"] <= 100, args
    elif name == "update":
        assert 0 <= args["id"] <= 9999 and isinstance(args["fields"]["active"], bool), args
        assert len(args["fields"].get("name", "")) <= 8, args
    elif name == "answer":
        assert isinstance(args["value"], str) and len(args["value"]) <= 10, args
    else:
        raise AssertionError(f"unknown tool {name}")

msgs = [{"role": "user", "content": "Find the three newest orders"}]
total = 0
for label, extra in [("greedy", {"temperature": 0}),
                     ("sampled full vocab", {"temperature": 1.0}),
                     ("sampled top_k 20", {"temperature": 1.0, "top_k": 20}),
                     ("named update", {"temperature": 1.0, "tool_choice": {"type": "function", "function": {"name": "update"}}})]:
    body = {"model": model, "messages": msgs, "tools": tools, "tool_choice": "required",
            "max_tokens": 400, "n": 32, "seed": 5, **extra}
    out = post(body)
    n_calls = 0
    for c in out["choices"]:
        calls = c["message"].get("tool_calls") or []
        assert c["finish_reason"] == "tool_calls" and calls, c
        for call in calls:
            check_call(call["function"]["name"], json.loads(call["function"]["arguments"]))
            if label == "named update":
                assert call["function"]["name"] == "update", call
            n_calls += 1
    total += len(out["choices"])
    print(f"{label}: {len(out['choices'])} answers, {n_calls} calls, all valid")
schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["ok", "n"], "additionalProperties": False}
out = post({"model": model, "messages": msgs, "max_tokens": 100, "n": 32, "temperature": 1.0, "seed": 2,
            "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}}})
for c in out["choices"]:
    v = json.loads(c["message"]["content"])
    assert isinstance(v["ok"], bool) and 0 <= v["n"] <= 9 and set(v) == {"ok", "n"}, v
print(f"json_schema: {len(out['choices'])} answers, all valid JSON of the schema")
print(f"constrained over HTTP on the GPU: {total + len(out['choices'])} answers valid")
