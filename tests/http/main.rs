//! The library's HTTP host (`policy_serve::server`) on an ephemeral loopback port, driven with
//! reqwest and with the official `openai` Python client.

#[path = "../common/mod.rs"]
mod common;

use std::sync::Arc;

use clap::Parser;
use policy_serve::server as serve;
use serde_json::{Value, json};

mod chat;
mod completions;
mod constrained;
mod episodes;
mod errors;
mod hardening;
mod lora;
mod weights;

pub(crate) struct Server {
    pub(crate) base: String,
    pub(crate) state: Arc<serve::AppState>,
}

pub(crate) async fn start(extra: &[&str]) -> Server {
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
pub(crate) fn sse_chunks(text: &str) -> Vec<Value> {
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

pub(crate) fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "query", "description": "Run SQL", "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]}}},
        {"type": "function", "function": {"name": "answer", "description": "Answer", "parameters": {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}}}
    ])
}

pub(crate) async fn post(s: &Server, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Posts `body` and leaves (drops the connection) once the tiny model's engine has admitted
/// the request it causes (its prefix-cache lookups pass `lookups`): deterministic however
/// slow the machine.
pub(crate) async fn post_and_leave_once_admitted(
    s: &Server,
    path: &str,
    body: Value,
    lookups: u64,
) {
    let model = s.state.registry().model("tiny").unwrap();
    let task = tokio::spawn(
        reqwest::Client::new()
            .post(format!("{}{path}", s.base))
            .json(&body)
            .send(),
    );
    let t = std::time::Instant::now();
    while model.engine().stats().cache_lookups <= lookups {
        assert!(
            !task.is_finished(),
            "the request ended before it was admitted"
        );
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "never admitted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    task.abort();
}

/// Sends `bytes` on a raw connection, waits `wait`, and returns what the server sent before
/// closing the connection; `None` when the connection was still open 5 s later. (A server
/// that closes while the bytes are still being written, e.g. on oversized headers, is no
/// failure here: what it answered is read all the same.)
pub(crate) async fn raw_exchange(
    s: &Server,
    bytes: &[u8],
    wait: std::time::Duration,
) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = s.base.trim_start_matches("http://");
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = c.write_all(bytes).await;
    tokio::time::sleep(wait).await;
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(5), c.read_to_end(&mut buf))
        .await
        .is_ok();
    closed.then(|| String::from_utf8_lossy(&buf).into_owned())
}
