//! Chat completions over HTTP: tools, usage, SSE streaming, disconnects, the official
//! `openai` Python client, the models list and metrics.

use serde_json::{Value, json};

use super::*;

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
    // Nothing left the GPU: none of it came from the tiers below.
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens_host"], 0);
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens_disk"], 0);
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
    // The chunk with the finish reason says which weights answered, as the whole answer does.
    let last = chunks
        .iter()
        .rfind(|c| c["choices"][0]["finish_reason"].is_string())
        .unwrap();
    assert_eq!(last["weights_version"], whole["weights_version"]);
    assert_eq!(last["weights_version"]["version"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_disconnects_frees_its_sequence() {
    let s = start(&["--max-tokens-cap", "3000"]).await;
    let model = s.state.registry().model("tiny").unwrap();
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "write forever"}], "max_tokens": 3000});
    // Give up once the request runs, long before 3000 tokens are generated.
    post_and_leave_once_admitted(&s, "/v1/chat/completions", body, 0).await;
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
        // The KV tiers (the host tier is on by default): blocks per tier, loads, checksums.
        "policy_serve_kv_tier_blocks{model=\"tiny\",tier=\"host\"} 0",
        "policy_serve_kv_tier_loads_total{model=\"tiny\",tier=\"disk\"} 0",
        "policy_serve_kv_tier_checksum_failures_total{model=\"tiny\"} 0",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
}
