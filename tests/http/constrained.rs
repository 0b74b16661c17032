//! Constrained answers over HTTP: `tool_choice` (`required`, a named function, `none`,
//! `auto`) and `response_format` (`json_schema`, `json_object`) on chat completions and
//! episodes, sampled from the tiny random model (garbage unless constrained), and the 400s of
//! constraints that cannot be served.

use serde_json::{Value, json};

use super::*;

fn nested_tools() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(common::fixtures().join("tools/nested.json")).unwrap(),
    )
    .unwrap()
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "tools": nested_tools(), "max_tokens": 300,
        "temperature": 1.0, "seed": 7,
        "messages": [{"role": "user", "content": "Find the three newest orders"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Each choice's calls: (name, arguments object), checked to be well formed.
fn calls(choice: &Value) -> Vec<(String, Value)> {
    choice["message"]["tool_calls"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    let args: Value =
                        serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
                    (c["function"]["name"].as_str().unwrap().to_string(), args)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn required_and_named_tool_choice_always_answer_with_valid_calls() {
    let s = start(&["--max-tokens-cap", "300"]).await;
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"tool_choice": "required", "n": 8})),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "tool_calls", "{c}");
        let calls = calls(c);
        assert!(!calls.is_empty());
        for (name, args) in calls {
            let required: &[&str] = match name.as_str() {
                "query" => &["table", "columns"],
                "update" => &["id", "fields"],
                "answer" => &["value"],
                other => panic!("unknown tool {other}"),
            };
            assert!(
                required.iter().all(|k| args.get(k).is_some()),
                "{name} {args}"
            );
        }
    }
    let named =
        json!({"tool_choice": {"type": "function", "function": {"name": "answer"}}, "n": 4});
    let (code, v) = post(&s, "/v1/chat/completions", chat(named)).await;
    assert_eq!(code, 200, "{v}");
    for c in v["choices"].as_array().unwrap() {
        let calls = calls(c);
        assert_eq!(calls.len(), 1, "{c}");
        assert_eq!(calls[0].0, "answer");
    }
    // The control: the same request unconstrained holds no call.
    let (_, v) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"n": 4, "max_tokens": 40})),
    )
    .await;
    assert!(
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| calls(c).is_empty()),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn json_schema_answers_are_json_of_the_schema() {
    let s = start(&["--max-tokens-cap", "300"]).await;
    let format = json!({"type": "json_schema", "json_schema": {"name": "verdict", "schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["ok", "n"], "additionalProperties": false}}});
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"response_format": format, "tool_choice": "none", "n": 4})),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    for c in v["choices"].as_array().unwrap() {
        let content: Value = serde_json::from_str(c["message"]["content"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{c}: {e}"));
        assert!(
            content["ok"].is_boolean() && content["n"].as_u64().unwrap() <= 9,
            "{content}"
        );
        assert!(
            c["message"]["tool_calls"]
                .as_array()
                .is_none_or(|a| a.is_empty())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn constraints_that_cannot_be_served_are_400s_naming_the_cause() {
    let s = start(&[]).await;
    let mut tools = nested_tools();
    tools[1]["function"]["parameters"]["properties"]["id"]["not"] = json!({"const": 3});
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        chat(json!({"tools": tools, "tool_choice": "required", "max_tokens": 8})),
    )
    .await;
    assert_eq!(code, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert_eq!(v["error"]["code"], "invalid_constraint", "{v}");
    assert!(
        msg.contains("tool `update`") && msg.contains("not"),
        "{msg}"
    );
    let (code, v) = post(&s, "/v1/chat/completions", chat(json!({"tool_choice": {"type": "function", "function": {"name": "drop_table"}}, "max_tokens": 8}))).await;
    assert_eq!(code, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`drop_table`"),
        "{v}"
    );
    for (field, value) in [
        ("tool_choice", json!("sometimes")),
        ("tool_choice", json!(3)),
        ("response_format", json!({"type": "yaml"})),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
        ),
    ] {
        let (code, v) = post(
            &s,
            "/v1/chat/completions",
            chat(json!({field: value, "max_tokens": 8})),
        )
        .await;
        assert_eq!(code, 400, "{field} {value}: {v}");
        assert_eq!(v["error"]["param"], field, "{v}");
    }
    // Raw completions do not constrain.
    let (code, v) = post(
        &s,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "x", "max_tokens": 4,
        "response_format": {"type": "json_object"}}),
    )
    .await;
    assert_eq!(code, 400, "{v}");
    assert_eq!(v["error"]["param"], "response_format");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_episode_with_required_tool_choice_acts_with_calls() {
    let s = start(&["--max-tokens-cap", "300"]).await;
    let (code, v) = post(
        &s,
        "/v1/episodes",
        json!({"model": "tiny", "tools": nested_tools(),
        "tool_choice": "required", "temperature": 1.0, "seed": 3, "max_tokens": 300}),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    for observation in [json!("Find the newest order"), json!(["3 rows"])] {
        let (code, step) = post(
            &s,
            &format!("/v1/episodes/{id}/act"),
            json!({"observation": observation}),
        )
        .await;
        assert_eq!(code, 200, "{step}");
        assert_eq!(step["action"]["type"], "call", "{step}");
    }
    // A schema the grammar engine refuses is refused when the episode opens.
    let mut tools = nested_tools();
    tools[0]["function"]["parameters"]["not"] = json!({});
    let (code, v) = post(
        &s,
        "/v1/episodes",
        json!({"model": "tiny", "tools": tools, "tool_choice": "auto"}),
    )
    .await;
    assert_eq!(code, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tool `query`"),
        "{v}"
    );
}
