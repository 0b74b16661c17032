//! Hardening, round 2: each defect a hostile but realistic client found, reproduced over HTTP
//! (the CLI ones are in `tests/cli.rs`). Each test fails on the code before the fix; the
//! comment on each says which mutation makes it fail again.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;

/// Posts `body` but gives up after `after` (the client goes away mid-request).
async fn post_and_leave(s: &Server, path: &str, body: Value, after: Duration) {
    let fut = reqwest::Client::new()
        .post(format!("{}{path}", s.base))
        .json(&body)
        .send();
    let r = tokio::time::timeout(after, fut).await;
    assert!(
        r.is_err(),
        "the request was meant to outlive its client: {r:?}"
    );
}

/// Waits until the tiny model's engine has cancelled `n` requests and runs none.
async fn wait_cancelled(s: &Server, n: u64) -> policy_serve::engine::EngineStats {
    let model = s.state.registry().model("tiny").unwrap();
    let t = Instant::now();
    loop {
        let st = model.engine().stats();
        if st.requests_cancelled == n && st.running == 0 {
            return st;
        }
        assert_eq!(
            st.requests_finished, 0,
            "a long act must not finish: {st:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(30), "{st:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn episode(s: &Server, extra: Value) -> String {
    let mut body = json!({"model": "tiny", "max_tokens": 3000});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (code, v) = post(s, "/v1/episodes", body).await;
    assert_eq!(code, 201, "{v}");
    v["id"].as_str().unwrap().to_string()
}

// Mutations that fail it: the act not cancelled when its handler is dropped (no
// `cancel_on_drop`), or the transcript not taken back on a cancelled act (no `truncate`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_act_whose_client_leaves_is_cancelled_and_leaves_the_episode_as_it_was() {
    let s = start(&["--max-tokens-cap", "3000"]).await;
    let model = s.state.registry().model("tiny").unwrap();
    let id = episode(&s, json!({})).await;
    let act = format!("/v1/episodes/{id}/act");
    let task = json!({"observation": "count to a million"});
    post_and_leave_once_admitted(&s, &act, task.clone(), 0).await;
    let first = wait_cancelled(&s, 1).await;
    // The harness retries the same act: its prompt is the first one's, not the first one
    // plus a half-finished answer.
    post_and_leave_once_admitted(&s, &act, task, 1).await;
    let second = wait_cancelled(&s, 2).await;
    let first_prompt = first.cache_lookup_tokens;
    let retry_prompt = second.cache_lookup_tokens - first.cache_lookup_tokens;
    assert_eq!(retry_prompt, first_prompt, "{first:?}\n{second:?}");
    assert_eq!(
        second.blocks_free + second.cached_blocks,
        second.blocks_total
    );
    assert_eq!(model.engine().stats().requests_finished, 0);
}

// Mutation that fails it: DELETE removing the episode without cancelling its running acts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_cancels_a_running_act() {
    let s = start(&["--max-tokens-cap", "3000"]).await;
    let id = episode(&s, json!({})).await;
    let base = s.base.clone();
    let act = tokio::spawn({
        let url = format!("{base}/v1/episodes/{id}/act");
        async move {
            let t = Instant::now();
            let r = reqwest::Client::new()
                .post(url)
                .json(&json!({"observation": "count to a million"}))
                .send()
                .await
                .unwrap();
            let code = r.status().as_u16();
            (code, r.json::<Value>().await.unwrap(), t.elapsed())
        }
    });
    // The act is running (admitted by the engine) when the DELETE comes.
    let model = s.state.registry().model("tiny").unwrap();
    let t = Instant::now();
    while model.engine().stats().cache_lookups == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the act never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let del = reqwest::Client::new()
        .delete(format!("{base}/v1/episodes/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status().as_u16(), 204);
    let (code, v, took) = act.await.unwrap();
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["error"]["type"], "cancelled", "{v}");
    assert!(
        took < Duration::from_secs(10),
        "the act ran on for {took:?}"
    );
    wait_cancelled(&s, 1).await;
}

// Mutation that fails it: the sweeper (or the act's own expiry check) ignoring running acts,
// or the idle time starting when the act started.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_episode_is_never_swept_under_its_own_act() {
    let s = start(&["--max-tokens-cap", "3000", "--episode-ttl-secs", "1"]).await;
    let id = episode(&s, json!({})).await;
    let act = format!("/v1/episodes/{id}/act");
    // An act of 2.5 s, more than twice the TTL (cancelled by its client leaving).
    post_and_leave(
        &s,
        &act,
        json!({"observation": "count"}),
        Duration::from_millis(2500),
    )
    .await;
    wait_cancelled(&s, 1).await;
    // The next act, right after: the episode is there (its idle time started just now).
    let r = tokio::time::timeout(
        Duration::from_millis(600),
        reqwest::Client::new()
            .post(format!("{}{act}", s.base))
            .json(&json!({"observation": "again"}))
            .send(),
    )
    .await;
    if let Ok(r) = r {
        let r = r.unwrap();
        let code = r.status().as_u16();
        panic!(
            "the act answered {code} at once: {}",
            r.text().await.unwrap()
        );
    }
    wait_cancelled(&s, 2).await;
}

// Mutation that fails it: no fuel on the template environment (the request never answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hostile_chat_template_is_a_clear_error_in_bounded_time() {
    let dir = common::tiny_model_copy();
    let cfg_path = dir.join("tokenizer_config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["chat_template"] =
        json!("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let _ = std::fs::remove_file(dir.join("chat_template.jinja"));
    let hostile = format!("hostile={}", dir.display());
    let s = start(&["--model-dir", &hostile]).await;
    let t = Instant::now();
    let body = json!({"model": "hostile", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (code, v) = tokio::time::timeout(
        Duration::from_secs(60),
        post(&s, "/v1/chat/completions", body),
    )
    .await
    .expect("the request must answer");
    assert!(code == 400 || code == 503, "{code} {v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("chat template"), "{msg}");
    assert!(!msg.contains(&dir.display().to_string()), "{msg}");
    // The same model keeps answering (each render has its own budget).
    let (code2, _) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "hostile", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    )
    .await;
    assert_eq!(code2, code);
    assert!(t.elapsed() < Duration::from_secs(60));
}

// Mutation that fails it: the KV budget not checked against the host before allocating (the
// process aborts on the allocation).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn absurd_engine_flags_are_a_503_for_that_model_and_the_server_stays_up() {
    let s = start(&["--kv-cache-gib", "100000", "--max-running", "100000000"]).await;
    let body =
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (code, v) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(code, 503, "{v}");
    assert_eq!(v["error"]["type"], "model_load_failed", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("--kv-cache-gib"), "{msg}");
    assert_eq!(msg.matches("failed to load model").count(), 1, "{msg}");
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "demo", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(code, 200, "{v}");
}

// Mutation that fails it: `prompt + max_new` unchecked (it wraps, and the request runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_max_tokens_of_u64_max_is_refused_before_anything_runs() {
    let cap = u64::MAX.to_string();
    let s = start(&["--max-tokens-cap", &cap]).await;
    // Loaded first: the time bound below is the request's, not the model load's.
    let engine = s.state.registry().model("tiny").unwrap().engine().clone();
    for stream in [false, true] {
        let t = Instant::now();
        let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": u64::MAX, "stream": stream});
        let (code, v) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!(code, 400, "stream {stream}: {v}");
        assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
        assert_eq!(v["error"]["param"], "max_tokens", "{v}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }
    let st = engine.stats();
    assert_eq!(st.steps, 0, "{st:?}");
}

// Mutation that fails it: the default cap not lowered to the room the prompt leaves (the
// request is refused naming max_new_tokens (512)).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_max_tokens_a_long_prompt_gets_the_room_left_in_the_context() {
    let s = start(&["--max-tokens-cap", "4096"]).await;
    let engine = s.state.registry().model("tiny").unwrap().engine().clone();
    let context = engine.info().max_context;
    // A prompt that leaves fewer than 512 tokens (and some room).
    let mut words = context - 40;
    let content = loop {
        let c = "hi ".repeat(words);
        if engine.tokenize(&c).unwrap().len() <= context - 40 {
            break c;
        }
        words -= 8;
    };
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": content}], "ignore_eos": true}),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let completion = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert!(context - prompt < 512, "prompt {prompt} of {context}");
    assert_eq!(completion, context - prompt, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // With a max_tokens that cannot fit: context_length_exceeded, naming max_tokens.
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 600}),
    )
    .await;
    assert_eq!(code, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert_eq!(v["error"]["param"], "max_tokens", "{v}");
}

// Mutation that fails it: the connection's stream not wrapped (`OpenAiErrors`): hyper's own
// 400/431 go out with empty bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_of_the_http_layer_itself_have_the_openai_shape() {
    let s = start(&[]).await;
    let many: String = (0..150).map(|i| format!("x-h{i}: v\r\n")).collect();
    let big = format!("x-big: {}\r\n", "a".repeat(600 * 1024));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage request line", b"GARBAGE\r\n\r\n".to_vec()),
        (
            "150 headers",
            format!("GET /v1/models HTTP/1.1\r\nhost: x\r\n{many}\r\n").into_bytes(),
        ),
        (
            "a 600 KB header",
            format!("GET /v1/models HTTP/1.1\r\nhost: x\r\n{big}\r\n").into_bytes(),
        ),
        (
            "Content-Length: abc",
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n".to_vec(),
        ),
        (
            "a 24-digit Content-Length",
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 123456789012345678901234\r\n\r\n".to_vec(),
        ),
        (
            "\\xff in the path",
            b"GET /v1/\xffmodels HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
        ),
    ];
    for (what, bytes) in cases {
        let answer = raw_exchange(&s, &bytes, Duration::ZERO)
            .await
            .unwrap_or_else(|| panic!("{what}: the connection stayed open"));
        let (head, body) = answer
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("{what}: no answer: {answer:?}"));
        let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
        assert!((400..500).contains(&status), "{what}: {head}");
        let v: Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("{what}: body not JSON ({e}): {head}\n{body:?}"));
        assert!(v["error"]["message"].is_string(), "{what}: {v}");
        assert!(v["error"]["type"].is_string(), "{what}: {v}");
    }
    // The server still answers.
    let (code, _) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "demo", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(code, 200);
}

// Mutations that fail it: `model`/`stream_options`/`system_prompt` typed by serde again (the
// error names no field), or `max_completion_tokens` checked under the name `max_tokens`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_bad_field_is_named_in_param() {
    let s = start(&[]).await;
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let chat = [
        (json!({"model": 5, "messages": msgs}), "model"),
        (
            json!({"model": "demo", "messages": msgs, "stream": true, "stream_options": {"include_usage": "yes"}}),
            "stream_options",
        ),
        (
            json!({"model": "tiny", "messages": msgs, "max_completion_tokens": 0}),
            "max_completion_tokens",
        ),
        (
            json!({"model": "tiny", "messages": msgs, "max_completion_tokens": "abc", "max_tokens": 5}),
            "max_completion_tokens",
        ),
        (
            json!({"model": "demo", "messages": msgs, "stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (
            json!({"model": "tiny", "messages": msgs, "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            json!({"model": "tiny", "messages": msgs, "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            json!({"model": "tiny", "messages": msgs, "chat_template_kwargs": {"tools_first": true}}),
            "chat_template_kwargs",
        ),
        (
            json!({"model": "tiny", "messages": msgs, "response_format": {"type": "xml"}}),
            "response_format",
        ),
        // One validation path: the demo refuses what a model refuses.
        (
            json!({"model": "tiny", "messages": msgs, "min_tokens": 10, "max_tokens": 5}),
            "min_tokens",
        ),
        (
            json!({"model": "demo", "messages": msgs, "min_tokens": 10, "max_tokens": 5}),
            "min_tokens",
        ),
    ];
    for (body, param) in chat {
        let (code, v) = post(&s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(code, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
    let (code, v) = post(
        &s,
        "/v1/episodes",
        json!({"model": "demo", "system_prompt": 5}),
    )
    .await;
    assert_eq!(
        (code, v["error"]["param"].clone()),
        (400, json!("system_prompt")),
        "{v}"
    );
    // Defaults are still accepted: logprobs false, a text response format.
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "demo", "messages": msgs, "logprobs": false, "response_format": {"type": "text"}}),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    // An act with no observation at all.
    let (code, v) = post(&s, "/v1/episodes", json!({"model": "demo"})).await;
    assert_eq!(code, 201, "{v}");
    let id = v["id"].as_str().unwrap();
    let (code, v) = post(
        &s,
        &format!("/v1/episodes/{id}/act"),
        json!({"observation": []}),
    )
    .await;
    assert_eq!(
        (code, v["error"]["param"].clone()),
        (400, json!("observation")),
        "{v}"
    );
}

// Mutations that fail it: a case-sensitive `strip_prefix("Bearer ")`, or auth as a route
// layer (unknown routes answer 404 and a body is read before the token is checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bearer_scheme_is_case_insensitive_and_checked_before_anything_else() {
    let s = start(&["--token", "secret"]).await;
    let c = reqwest::Client::new();
    for auth in [
        "Bearer secret",
        "bearer secret",
        "BEARER secret",
        "Bearer  secret",
    ] {
        let r = c
            .get(format!("{}/v1/models", s.base))
            .header("authorization", auth)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{auth}");
    }
    for path in ["/nope", "/v1/secret-route"] {
        let r = c.get(format!("{}{path}", s.base)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{path}");
    }
    let r = c
        .delete(format!("{}/v1/models", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "method probing");
    // A declared body is not waited for: 401 at once, and the connection ends.
    let answer = raw_exchange(
        &s,
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000\r\n\r\n{",
        Duration::ZERO,
    )
    .await
    .expect("the connection ends after the 401");
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    let health = c.get(format!("{}/health", s.base)).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
}

// Mutation that fails it: only the slash-based redaction (a path with spaces leaks its tail).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_model_dir_with_spaces_is_never_named_in_an_error() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a b").join("secret dir");
    std::fs::create_dir_all(&dir).unwrap();
    let k = format!("k={}", dir.display());
    let s = start(&["--model-dir", &k]).await;
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "k", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(code, 503, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(!msg.contains("a b") && !msg.contains("secret"), "{msg}");
    assert_eq!(msg.matches("failed to load model").count(), 1, "{msg}");
}
