//! The library's HTTP host (`policy_serve::server`) on an ephemeral loopback port, driven with
//! reqwest and with the official `openai` Python client.

mod common;

use std::sync::Arc;

use clap::Parser;
use policy_serve::server as serve;
use serde_json::{Value, json};

struct Server {
    base: String,
    state: Arc<serve::AppState>,
}

async fn start(extra: &[&str]) -> Server {
    let dir = common::shared_tiny_model();
    let tiny = format!("tiny={}", dir.display());
    let mut args = vec![
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--device",
        "cpu",
        "--model-dir",
        tiny.as_str(),
    ];
    if !extra.contains(&"--max-body-bytes") {
        args.extend_from_slice(&["--max-body-bytes", "65536"]);
    }
    if !extra.contains(&"--max-tokens-cap") {
        args.extend_from_slice(&["--max-tokens-cap", "64"]);
    }
    args.extend_from_slice(extra);
    let cfg = serve::Config::parse_from(args);
    let state = serve::AppState::new(cfg).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let st = state.clone();
    tokio::spawn(async move {
        serve::serve_on(listener, st, std::future::pending())
            .await
            .unwrap()
    });
    Server { base, state }
}

/// The JSON chunks of an SSE body, checking that it ends with `[DONE]`.
fn sse_chunks(text: &str) -> Vec<Value> {
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(*data.last().unwrap(), "[DONE]");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "query", "description": "Run SQL", "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]}}},
        {"type": "function", "function": {"name": "answer", "description": "Answer", "parameters": {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}}}
    ])
}

async fn post(s: &Server, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn models_lists_the_demo_first_and_health_answers() {
    let s = start(&[]).await;
    let v: Value = reqwest::get(format!("{}/v1/models", s.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "demo");
    assert!(
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "tiny")
    );
    let h: Value = reqwest::get(format!("{}/health", s.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_with_tools_on_the_demo_returns_openai_tool_calls() {
    let s = start(&[]).await;
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "demo", "messages": [{"role": "user", "content": "hi"}], "tools": tools()}),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls");
    assert_eq!(c["message"]["role"], "assistant");
    let call = &c["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "query");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["sql"].is_string());
    assert!(v["usage"]["prompt_tokens_details"]["cached_tokens"].is_number());
    // After one assistant turn the demo moves on to the next tool.
    let (_, v2) = post(&s, "/v1/chat/completions", json!({"model": "demo", "tools": tools(), "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "query", "arguments": "{\"sql\": \"x\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"}]})).await;
    assert_eq!(
        v2["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_on_the_tiny_qwen3_reports_usage_and_cached_tokens() {
    let s = start(&[]).await;
    let body = json!({"model": "tiny", "messages": [{"role": "system", "content": "Use the tools well and answer precisely."}, {"role": "user", "content": "Count the users"}], "tools": tools(), "max_tokens": 8, "temperature": 0});
    let (code, a) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(code, 200, "{a}");
    let (_, b) = post(&s, "/v1/chat/completions", body).await;
    assert!(a["usage"]["prompt_tokens"].as_u64().unwrap() > 100);
    assert!(a["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
    assert_eq!(
        a["choices"][0]["message"], b["choices"][0]["message"],
        "greedy is deterministic"
    );
    assert!(
        b["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 100,
        "{b}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streaming_sends_sse_chunks_ending_with_done() {
    let s = start(&[]).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&json!({"model": "demo", "messages": [{"role": "user", "content": "hi"}], "tools": tools(), "stream": true, "stream_options": {"include_usage": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = r.text().await.unwrap();
    let chunks = sse_chunks(&text);
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "query")
    );
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "tool_calls")
    );
    assert!(chunks.last().unwrap()["usage"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_episode_lives_acts_and_is_deleted() {
    let s = start(&[]).await;
    for model in ["demo", "tiny"] {
        let (code, v) = post(&s, "/v1/episodes", json!({"model": model, "system_prompt": "Be brief.", "tools": tools(), "max_tokens": 6, "temperature": 0})).await;
        assert_eq!(code, 201, "{v}");
        let id = v["id"].as_str().unwrap().to_string();
        let (code, step) = post(
            &s,
            &format!("/v1/episodes/{id}/act"),
            json!({"observation": "How many users?"}),
        )
        .await;
        assert_eq!(code, 200, "{step}");
        assert!(step["action"]["type"].is_string() && step["raw"].is_string());
        assert!(step["cost"]["latency_ms"].is_number());
        let (code, _) = post(
            &s,
            &format!("/v1/episodes/{id}/act"),
            json!({"observation": ["result one"]}),
        )
        .await;
        assert_eq!(code, 200);
        let r = reqwest::Client::new()
            .delete(format!("{}/v1/episodes/{id}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
        let (code, err) = post(
            &s,
            &format!("/v1/episodes/{id}/act"),
            json!({"observation": "x"}),
        )
        .await;
        assert_eq!(code, 404);
        assert!(err["error"]["message"].as_str().unwrap().contains(&id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_get_openai_style_errors_and_do_not_affect_others() {
    let s = start(&["--model-dir", "broken=/nonexistent/model"]).await;
    let good = {
        let s_base = s.base.clone();
        tokio::spawn(async move {
            reqwest::Client::new().post(format!("{s_base}/v1/chat/completions")).json(&json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})).send().await.unwrap().status().as_u16()
        })
    };
    let client = reqwest::Client::new();
    let raw = client
        .post(format!("{}/v1/chat/completions", s.base))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let v: Value = raw.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    let cases = [
        (
            json!({"messages": [{"role": "user", "content": "x"}]}),
            400,
            "`model` is required",
        ),
        (
            json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
            404,
            "not offered",
        ),
        (json!({"model": "tiny", "messages": []}), 400, "non-empty"),
        (
            json!({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}),
            400,
            "unknown role",
        ),
        (
            json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}),
            400,
            "between 1 and 64",
        ),
        (
            json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
            400,
            "tools",
        ),
        (
            json!({"model": "broken", "messages": [{"role": "user", "content": "x"}]}),
            503,
            "does not exist",
        ),
    ];
    for (body, status, needle) in cases {
        let (code, v) = post(&s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(code, status, "{body} -> {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{msg:?} should contain {needle:?}");
        assert!(v["error"]["type"].is_string());
    }
    let big = "x".repeat(70_000);
    let r = client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&json!({"model": "demo", "messages": [{"role": "user", "content": big}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(
        good.await.unwrap(),
        200,
        "the good request was not affected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bearer_token_guards_every_route_but_health() {
    let s = start(&["--token", "s3cret"]).await;
    let status = |path: &'static str, token: Option<&'static str>| {
        let mut req = reqwest::Client::new().get(format!("{}{path}", s.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status("/v1/models", None).await, 401);
    assert_eq!(status("/v1/models", Some("wrong")).await, 401);
    assert_eq!(status("/v1/models", Some("s3cret")).await, 200);
    assert_eq!(status("/metrics", None).await, 401);
    assert_eq!(status("/health", None).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_are_prometheus_text_with_requests_tokens_cache_queue_and_episodes() {
    let s = start(&[]).await;
    post(
        &s,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    )
    .await;
    let text = reqwest::get(format!("{}/metrics", s.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "policy_serve_requests_total{route=\"chat_completions\"} 1",
        "policy_serve_tokens_total{kind=\"prompt\"}",
        "policy_serve_cache_hit_rate{model=\"tiny\"}",
        "policy_serve_queue_depth{model=\"tiny\"}",
        "policy_serve_episodes_open 0",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_disconnects_frees_its_sequence() {
    let s = start(&["--max-tokens-cap", "3000"]).await;
    let model = s.state.registry().model("tiny").unwrap();
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "write forever"}], "max_tokens": 3000});
    let fut = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&body)
        .send();
    // Give up long before 64 tokens are generated.
    let _ = tokio::time::timeout(std::time::Duration::from_millis(30), fut).await;
    let t = std::time::Instant::now();
    loop {
        let st = model.engine().stats();
        assert_eq!(st.requests_finished, 0, "3000 tokens cannot be done yet");
        if st.requests_cancelled == 1 && st.running == 0 {
            assert_eq!(st.blocks_free + st.cached_blocks, st.blocks_total);
            break;
        }
        assert!(t.elapsed().as_secs() < 30, "{st:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_official_openai_python_client_parses_our_responses() {
    let s = start(&[]).await;
    let has_openai = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !has_openai {
        let ok = std::process::Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "openai"])
            .status()
            .expect("python3 is needed for this test");
        assert!(ok.success(), "`python3 -m pip install openai` failed");
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let base = s.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .arg(base)
            .args(["demo", "tiny"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("openai client ok: demo, tiny"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_episodes_expire_and_the_episode_cap_is_enforced() {
    let s = start(&["--episode-ttl-secs", "1", "--max-episodes", "1"]).await;
    let (code, v) = post(
        &s,
        "/v1/episodes",
        json!({"model": "demo", "tools": tools()}),
    )
    .await;
    assert_eq!(code, 201);
    let id = v["id"].as_str().unwrap().to_string();
    let (code, err) = post(
        &s,
        "/v1/episodes",
        json!({"model": "demo", "tools": tools()}),
    )
    .await;
    assert_eq!(code, 429, "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("DELETE"));
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    let (code, _) = post(
        &s,
        &format!("/v1/episodes/{id}/act"),
        json!({"observation": "x"}),
    )
    .await;
    assert_eq!(code, 404, "the idle episode expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streaming_a_model_sends_content_token_by_token_equal_to_the_whole_answer() {
    let s = start(&[]).await;
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 24, "temperature": 0});
    let (_, whole) = post(&s, "/v1/chat/completions", body.clone()).await;
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let text = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&streamed_body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let chunks = sse_chunks(&text);
    let pieces: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|p| !p.is_empty())
        .collect();
    if whole["choices"][0]["message"]["tool_calls"].is_null() {
        assert!(pieces.len() > 2, "content arrived in pieces: {pieces:?}");
        assert_eq!(
            pieces.concat(),
            whole["choices"][0]["message"]["content"].as_str().unwrap()
        );
    }
    assert_eq!(
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
            .next_back(),
        whole["choices"][0]["finish_reason"].as_str()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_disconnects_mid_stream_frees_its_sequence() {
    let s = start(&["--max-tokens-cap", "3000"]).await;
    let model = s.state.registry().model("tiny").unwrap();
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "write forever"}], "max_tokens": 3000, "stream": true});
    let mut resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("chat.completion.chunk"));
    drop(resp);
    let t = std::time::Instant::now();
    loop {
        let st = model.engine().stats();
        assert_eq!(st.requests_finished, 0, "3000 tokens cannot be done yet");
        if st.requests_cancelled == 1 && st.running == 0 {
            break;
        }
        assert!(t.elapsed().as_secs() < 30, "{st:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A copy of the tiny model whose generation_config samples but names no temperature.
fn sampling_model_without_temperature() -> std::path::PathBuf {
    let dir = common::tiny_model_copy();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"do_sample": true, "top_k": 20, "eos_token_id": [151645, 151643]}"#,
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_and_episodes_apply_the_same_sampling_defaults() {
    let dir = sampling_model_without_temperature();
    let s = start(&["--model-dir", &format!("sampler={}", dir.display())]).await;
    let system = "Use the tools well and answer precisely.";
    let user = "Count the users";
    let chat = |seed: u64| {
        json!({"model": "sampler", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
               "tools": tools(), "max_tokens": 12, "seed": seed})
    };
    let (code, a) = post(&s, "/v1/chat/completions", chat(7)).await;
    assert_eq!(code, 200, "{a}");
    let (code, ep) = post(&s, "/v1/episodes", json!({"model": "sampler", "system_prompt": system, "tools": tools(), "max_tokens": 12, "seed": 7})).await;
    assert_eq!(code, 201, "{ep}");
    let id = ep["id"].as_str().unwrap();
    let (code, step) = post(
        &s,
        &format!("/v1/episodes/{id}/act"),
        json!({"observation": user}),
    )
    .await;
    assert_eq!(code, 200, "{step}");
    // Same prompt, same seed, same defaults: the same text (the chat's content holds the raw
    // text when it is no valid tool call).
    let chat_text = a["choices"][0]["message"]["content"].as_str().unwrap_or("");
    let raw = step["raw"].as_str().unwrap();
    if a["choices"][0]["message"]["tool_calls"].is_null() {
        assert_eq!(chat_text, raw);
    } else {
        assert!(raw.contains("<tool_call>"), "{raw}");
    }
    // Positive control: the chat really samples (HF's temperature 1.0 when do_sample names
    // none, not greedy): its output changes with the seed.
    let mut outputs = std::collections::HashSet::new();
    for seed in [7u64, 8, 9, 10] {
        let (_, v) = post(&s, "/v1/chat/completions", chat(seed)).await;
        outputs.insert(v["choices"][0]["message"].to_string());
    }
    assert!(outputs.len() > 1, "seeds made no difference: {outputs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_and_episodes_refuse_the_same_bad_fields_naming_them() {
    let s = start(&[]).await;
    let cases = [
        ("max_tokens", json!("abc")),
        ("max_tokens", json!(-5)),
        ("max_tokens", json!(1.5)),
        ("max_tokens", json!(0)),
        ("temperature", json!(-1)),
        ("temperature", json!("hot")),
        ("top_p", json!(5)),
        ("seed", json!("x")),
    ];
    for (field, value) in cases {
        let mut chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}]});
        chat[field] = value.clone();
        let mut episode = json!({"model": "tiny", "tools": tools()});
        episode[field] = value.clone();
        let (c1, v1) = post(&s, "/v1/chat/completions", chat).await;
        let (c2, v2) = post(&s, "/v1/episodes", episode).await;
        assert_eq!((c1, c2), (400, 400), "{field}={value}: {v1} / {v2}");
        assert_eq!(v1["error"]["param"], field, "{v1}");
        assert_eq!(v1["error"], v2["error"], "{field}={value}");
    }
    // Non-text content parts are refused, naming the field.
    let (code, v) = post(&s, "/v1/chat/completions", json!({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})).await;
    assert_eq!(code, 400, "{v}");
    assert_eq!(v["error"]["param"], "messages");
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "tiny", "n": 2, "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(
        (code, v["error"]["param"].as_str()),
        (400, Some("n")),
        "{v}"
    );
    // Positive control: valid values pass on both routes.
    let (c, v) = post(&s, "/v1/episodes", json!({"model": "tiny", "tools": tools(), "max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "seed": 3})).await;
    assert_eq!(c, 201, "{v}");
}

/// A copy of the tiny model whose model.safetensors is cut short.
fn truncated_model() -> std::path::PathBuf {
    let dir = common::tiny_model_copy();
    let w = dir.join("model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 3]).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broken_checkpoint_is_a_503_naming_the_model_without_paths_and_loads_once() {
    let dir = truncated_model();
    let s = start(&["--model-dir", &format!("broken={}", dir.display())]).await;
    let body = json!({"model": "broken", "messages": [{"role": "user", "content": "hi"}]});
    let client = reqwest::Client::new();
    let sends: Vec<_> = (0..20)
        .map(|_| {
            client
                .post(format!("{}/v1/chat/completions", s.base))
                .json(&body)
                .send()
        })
        .collect();
    for r in futures_util::future::join_all(sends).await {
        let r = r.unwrap();
        assert_eq!(r.status(), 503);
        assert!(r.headers().contains_key("retry-after"));
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "model_load_failed", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("`broken`") && msg.contains("model.safetensors"),
            "{msg}"
        );
        assert!(
            !msg.contains(dir.to_str().unwrap()),
            "no server path: {msg}"
        );
    }
    assert_eq!(
        s.state.registry().load_attempts("broken"),
        1,
        "one load, then the back-off"
    );
    // The server and its other models are fine.
    let (code, _) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "demo", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(code, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_episode_cap_holds_for_concurrent_creates_while_the_model_loads() {
    let s = start(&["--max-episodes", "3"]).await;
    let client = reqwest::Client::new();
    let sends: Vec<_> = (0..24)
        .map(|_| {
            client
                .post(format!("{}/v1/episodes", s.base))
                .json(&json!({"model": "tiny", "tools": tools()}))
                .send()
        })
        .collect();
    let mut codes: Vec<u16> = Vec::new();
    for r in futures_util::future::join_all(sends).await {
        codes.push(r.unwrap().status().as_u16());
    }
    assert_eq!(codes.iter().filter(|c| **c == 201).count(), 3, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 429).count(), 21, "{codes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_error_has_the_openai_shape_and_its_headers() {
    let s = start(&["--token", "s3cret", "--max-episodes", "1"]).await;
    let client = reqwest::Client::new();
    let auth = |r: reqwest::RequestBuilder| r.bearer_auth("s3cret");
    let check = |v: &Value| {
        assert!(v["error"]["message"].is_string(), "{v}");
        assert!(v["error"]["type"].is_string(), "{v}");
        assert!(
            v["error"].get("param").is_some() && v["error"].get("code").is_some(),
            "{v}"
        );
    };
    let r = auth(client.get(format!("{}/no/such/route", s.base)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    check(&r.json().await.unwrap());
    let r = auth(client.get(format!("{}/v1/chat/completions", s.base)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    check(&r.json().await.unwrap());
    let r = client
        .get(format!("{}/v1/models", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    check(&r.json().await.unwrap());
    // A declared length over the limit is refused before the body is read.
    let r = auth(client.post(format!("{}/v1/chat/completions", s.base)))
        .header("content-type", "application/json")
        .body("x".repeat(70_000))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // The body was left unread, so the connection ends; the client must be told, or it
    // would send the next request on a connection the server is closing.
    assert_eq!(r.headers()["connection"], "close");
    check(&r.json().await.unwrap());
    let create = || {
        auth(client.post(format!("{}/v1/episodes", s.base)))
            .json(&json!({"model": "demo", "tools": tools()}))
            .send()
    };
    let first: Value = create().await.unwrap().json().await.unwrap();
    let id = first["id"].as_str().unwrap();
    assert!(
        id.len() == 3 + 32 && id.starts_with("ep-"),
        "128 random bits: {id}"
    );
    let r = create().await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    check(&r.json().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_absurd_config_is_a_clear_error_and_the_server_stays_up() {
    let dir = common::tiny_model_copy();
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    cfg["num_hidden_layers"] = json!(1_000_000_000u64);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let s = start(&["--model-dir", &format!("huge={}", dir.display())]).await;
    let (code, ep) = post(
        &s,
        "/v1/episodes",
        json!({"model": "tiny", "tools": tools()}),
    )
    .await;
    assert_eq!(code, 201);
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "huge", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(code, 503, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("num_hidden_layers"),
        "{v}"
    );
    // The open episode on another model still works.
    let id = ep["id"].as_str().unwrap();
    let (code, _) = post(
        &s,
        &format!("/v1/episodes/{id}/act"),
        json!({"observation": "hi"}),
    )
    .await;
    assert_eq!(code, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_streamed_request_over_the_context_is_refused_before_the_stream_starts() {
    let s = start(&[]).await;
    let long = "word ".repeat(5000);
    let body = |stream: bool| json!({"model": "tiny", "messages": [{"role": "user", "content": long}], "max_tokens": 8, "stream": stream});
    let (plain, pv) = post(&s, "/v1/chat/completions", body(false)).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&body(true))
        .send()
        .await
        .unwrap();
    assert_eq!(plain, 400, "{pv}");
    assert_eq!(
        r.status().as_u16(),
        400,
        "the same status as without streaming"
    );
    let sv: Value = r.json().await.unwrap();
    assert_eq!(sv["error"], pv["error"]);
}

/// Sends `head` on a raw connection, waits `wait`, and returns what the server sent before
/// closing the connection; `None` when the connection was still open 5 s later.
async fn raw_exchange(s: &Server, head: &str, wait: std::time::Duration) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = s.base.trim_start_matches("http://");
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(wait).await;
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(5), c.read_to_end(&mut buf))
        .await
        .is_ok();
    closed.then(|| String::from_utf8_lossy(&buf).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_clients_are_cut_off_by_the_header_and_body_timeouts() {
    let s = start(&["--header-timeout-secs", "1", "--body-timeout-secs", "1"]).await;
    // Half-sent headers: the connection is closed (at most a 408, never left open).
    let got = raw_exchange(
        &s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
        std::time::Duration::from_millis(1500),
    )
    .await
    .expect("the server closed the connection");
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 408"), "{got:?}");
    // A stalled body: a 408 in the OpenAI shape.
    let got = raw_exchange(
        &s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":",
        std::time::Duration::from_millis(1500),
    )
    .await
    .unwrap_or_default();
    assert!(got.starts_with("HTTP/1.1 408"), "{got:?}");
    assert!(got.contains("request_timeout"), "{got:?}");
    // The server still answers others.
    let h = reqwest::get(format!("{}/health", s.base)).await.unwrap();
    assert_eq!(h.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_demo_conversation_is_answered_for_its_step() {
    let s = start(&["--max-body-bytes", "4000000"]).await;
    // 8,000 assistant turns and a 200k-character last message: the demo answers as at step
    // 8,000 (past its tools: a reply quoting the last message), in one act.
    let mut messages = vec![json!({"role": "user", "content": "start"})];
    for i in 0..8000 {
        messages.push(json!({"role": "assistant", "content": format!("turn {i}")}));
        messages.push(json!({"role": "user", "content": "next"}));
    }
    messages.push(json!({"role": "user", "content": "y".repeat(200_000)}));
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "demo", "messages": messages, "tools": tools()}),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("yyyy")
    );
    // With one assistant turn the demo is at step 1: its second tool.
    let (_, v) = post(&s, "/v1/chat/completions", json!({"model": "demo", "tools": tools(), "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]})).await;
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "answer"
    );
}
