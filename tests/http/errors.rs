//! Errors over HTTP: the OpenAI shape for every refusal, auth, broken checkpoints, absurd
//! configs, slow clients.

use serde_json::{Value, json};

use super::*;

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
    // `n` other than a positive integer, or above 1 while streaming.
    for body in [
        json!({"model": "tiny", "n": 0, "messages": [{"role": "user", "content": "x"}]}),
        json!({"model": "tiny", "n": 2, "stream": true, "messages": [{"role": "user", "content": "x"}]}),
    ] {
        let (code, v) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!(
            (code, v["error"]["param"].as_str()),
            (400, Some("n")),
            "{v}"
        );
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_clients_are_cut_off_by_the_header_and_body_timeouts() {
    let s = start(&["--header-timeout-secs", "1", "--body-timeout-secs", "1"]).await;
    // Half-sent headers: the connection is closed (at most a 408, never left open).
    let got = raw_exchange(
        &s,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
        std::time::Duration::from_millis(1500),
    )
    .await
    .expect("the server closed the connection");
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 408"), "{got:?}");
    // A stalled body: a 408 in the OpenAI shape.
    let got = raw_exchange(
        &s,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":",
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
