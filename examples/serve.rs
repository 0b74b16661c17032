//! An HTTP host over the registry: OpenAI-compatible chat completions with tools (and SSE
//! streaming), an episodes API for harnesses, health and Prometheus metrics.
//!
//!     cargo run --release --example serve                     # the demo on 127.0.0.1:8080
//!     cargo run --release --example serve -- --model-dir qwen3-0.6b=/models/Qwen3-0.6B --preload
//!
//! Invariants: every error is an OpenAI-style JSON body with the right status; a malformed
//! request never affects another; a client that disconnects drops its pending generation, which
//! frees its sequence in the engine. Loopback by default; with `POLICY_SERVE_TOKEN` set, every
//! route but /health needs `Authorization: Bearer <token>`.

#![allow(dead_code)] // tests include this file as a module and use parts of it

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use parking_lot::Mutex;
use policy_serve::engine::{FinishReason, SamplingParams};
use policy_serve::policy::format::{Message, RenderOptions, parse_output};
use policy_serve::{
    Action, DemoPolicy, EngineOptions, EpisodeConfig, Error, GenerationRequest, ModelRegistry,
    Observation, Policy, ToolDefinition,
};
use serde_json::{Value, json};

/// Server settings.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "serve",
    about = "HTTP host for policy-serve: OpenAI chat completions + episodes API"
)]
pub struct Config {
    /// Address to listen on (env POLICY_SERVE_ADDR).
    #[arg(long, env = "POLICY_SERVE_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Model keys to offer (default: every key of the registry).
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<String>,
    /// Point a key at a local model directory: KEY=DIR (repeatable).
    #[arg(long = "model-dir", value_parser = parse_key_dir)]
    pub model_dirs: Vec<(String, PathBuf)>,
    /// Load the offered models at start-up (requests for a model still loading get 503).
    #[arg(long)]
    pub preload: bool,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Most open episodes.
    #[arg(long, default_value_t = 1024)]
    pub max_episodes: usize,
    /// Largest max_tokens a request may ask for.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens_cap: usize,
    /// Idle episodes expire after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub episode_ttl_secs: u64,
    /// Device: auto, cpu, cuda.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Bearer token required on every route but /health (env POLICY_SERVE_TOKEN).
    #[arg(long, env = "POLICY_SERVE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

fn parse_key_dir(s: &str) -> Result<(String, PathBuf), String> {
    let (k, d) = s.split_once('=').ok_or("expected KEY=DIR")?;
    Ok((k.to_string(), d.into()))
}

struct Episode {
    policy: Arc<Mutex<Box<dyn Policy>>>,
    last_used: Instant,
}

#[derive(Default)]
struct Counters {
    chat: AtomicU64,
    acts: AtomicU64,
    errors: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    cached_tokens: AtomicU64,
}

/// Shared server state.
pub struct AppState {
    registry: ModelRegistry,
    offered: Vec<String>,
    cfg: Config,
    episodes: Mutex<HashMap<String, Episode>>,
    loading: Mutex<Vec<String>>,
    counters: Counters,
    next_id: AtomicU64,
}

/// An OpenAI-style error response.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }
    fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let msg = e.to_string();
        match e {
            Error::UnknownModel { .. } => Self::new(StatusCode::NOT_FOUND, "model_not_found", msg),
            Error::ModelUnavailable { .. }
            | Error::Load { .. }
            | Error::Download { .. }
            | Error::Checkpoint { .. }
            | Error::Unsupported(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "model_unavailable", msg)
            }
            Error::InvalidInput(_)
            | Error::TooLarge(_)
            | Error::Template(_)
            | Error::Tokenizer(_)
            | Error::DemoMisuse { .. } => Self::bad(msg),
            _ => Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", msg),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut message = self.message;
        if self.status == StatusCode::INTERNAL_SERVER_ERROR {
            let id = format!(
                "req_{:x}",
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            );
            tracing::error!(request_id = %id, error = %message, "internal error");
            message = format!("{message} (request id {id})");
        }
        let body = json!({"error": {"message": message, "type": self.kind, "param": null, "code": self.kind}});
        (self.status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

impl AppState {
    /// Builds the state: the default registry, re-pointed and filtered as configured.
    pub fn new(cfg: Config) -> Result<Arc<Self>, Error> {
        let options = EngineOptions {
            device: cfg.device.parse()?,
            ..EngineOptions::default()
        };
        let mut registry = ModelRegistry::with_defaults().with_options(options);
        for (k, d) in &cfg.model_dirs {
            registry = match registry.spec(k) {
                Ok(_) => registry.with_local_dir(k, d)?,
                Err(_) => registry.with_model(policy_serve::ModelSpec::local(k, k, d)),
            };
        }
        let offered: Vec<String> = if cfg.models.is_empty() {
            registry.specs().map(|s| s.key.clone()).collect()
        } else {
            for k in &cfg.models {
                registry.spec(k)?;
            }
            cfg.models.clone()
        };
        Ok(Arc::new(Self {
            registry,
            offered,
            cfg,
            episodes: Mutex::new(HashMap::new()),
            loading: Mutex::new(Vec::new()),
            counters: Counters::default(),
            next_id: AtomicU64::new(1),
        }))
    }

    /// The registry behind the server.
    pub fn registry(&self) -> &ModelRegistry {
        &self.registry
    }

    fn id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        format!("{prefix}-{:x}{n:x}", t & 0xffff_ffff)
    }

    /// The key if offered and not loading; a typed API error otherwise.
    fn check_model(&self, key: &str) -> ApiResult<()> {
        if !self.offered.iter().any(|k| k == key) {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!("model `{key}` is not offered here; GET /v1/models lists them"),
            ));
        }
        let spec = self.registry.spec(key)?;
        if !spec.available {
            return Err(Error::ModelUnavailable {
                key: key.into(),
                label: spec.label.clone(),
            }
            .into());
        }
        if self.loading.lock().iter().any(|k| k == key) {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "model_loading",
                format!("model `{key}` is still loading; retry shortly"),
            ));
        }
        Ok(())
    }
}

/// The router with every route and limit.
pub fn app(state: Arc<AppState>) -> Router {
    let protected = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/episodes", post(create_episode))
        .route("/v1/episodes/{id}/act", post(act))
        .route("/v1/episodes/{id}", axum::routing::delete(delete_episode))
        .route("/metrics", get(metrics))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .merge(protected)
        .layer(DefaultBodyLimit::max(state.cfg.max_body_bytes))
        .with_state(state)
}

async fn auth(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    if let Some(token) = &st.cfg.token {
        let ok = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| t == token);
        if !ok {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "missing or wrong bearer token (Authorization: Bearer <token>)",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// Starts loading the offered models in the background; requests for them get 503 meanwhile.
pub fn preload(state: &Arc<AppState>) {
    for key in state.offered.clone() {
        if state
            .registry
            .spec(&key)
            .map(|s| s.is_demo() || !s.available)
            .unwrap_or(true)
        {
            continue;
        }
        state.loading.lock().push(key.clone());
        let st = state.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = st.registry.model(&key) {
                tracing::warn!(model = %key, error = %e, "preload failed");
            }
            st.loading.lock().retain(|k| k != &key);
        });
    }
}

/// Drops episodes idle for longer than the TTL, every quarter TTL.
pub fn spawn_sweeper(state: &Arc<AppState>) {
    let st = state.clone();
    tokio::spawn(async move {
        let ttl = Duration::from_secs(st.cfg.episode_ttl_secs.max(1));
        loop {
            tokio::time::sleep(ttl / 4).await;
            st.episodes
                .lock()
                .retain(|_, e| e.last_used.elapsed() < ttl);
        }
    });
}

async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    let data: Vec<Value> = st
        .registry
        .specs()
        .filter(|s| st.offered.contains(&s.key))
        .map(|s| json!({"id": s.key, "object": "model", "created": 0, "owned_by": "policy-serve", "label": s.label, "available": s.available, "loaded": s.is_demo() || st.registry.is_loaded(&s.key)}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

fn parse_body(body: &Bytes) -> ApiResult<Value> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))
}

/// OpenAI messages -> template messages: content parts joined, string tool arguments decoded
/// to objects (so the template renders them as in training, with `tojson`).
fn convert_messages(v: &Value) -> ApiResult<Vec<Message>> {
    let list = v
        .as_array()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| ApiError::bad("`messages` must be a non-empty list"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let mut m = m.clone();
        if let Some(parts) = m.get("content").and_then(Value::as_array) {
            let text: String = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("");
            m["content"] = Value::String(text);
        }
        if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for c in calls {
                if let Some(args) = c.pointer_mut("/function/arguments")
                    && let Some(s) = args.as_str()
                    && let Ok(obj @ Value::Object(_)) = serde_json::from_str::<Value>(s)
                {
                    *args = obj;
                }
            }
        }
        let msg: Message =
            serde_json::from_value(m).map_err(|e| ApiError::bad(format!("messages[{i}]: {e}")))?;
        if !["system", "user", "assistant", "tool"].contains(&msg.role.as_str()) {
            return Err(ApiError::bad(format!(
                "messages[{i}]: unknown role `{}`",
                msg.role
            )));
        }
        out.push(msg);
    }
    Ok(out)
}

fn parse_tools(v: Option<&Value>) -> ApiResult<Vec<ToolDefinition>> {
    match v {
        None | Some(Value::Null) => Ok(vec![]),
        Some(t) => ToolDefinition::list_from_json(&t.to_string())
            .map_err(|e| ApiError::bad(format!("`tools`: {e}"))),
    }
}

struct Completion {
    content: String,
    calls: Vec<policy_serve::ToolCall>,
    finish: &'static str,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
}

/// A chat request ready to run: answered already (the demo), or a generation to submit.
enum Prepared {
    Done(String, Completion),
    Model {
        key: String,
        engine: policy_serve::Engine,
        request: GenerationRequest,
        tools: Vec<ToolDefinition>,
    },
}

/// Turns a finished generation into the OpenAI view: tool calls when the output parses into
/// valid calls, the raw text otherwise.
fn to_completion(g: &policy_serve::Generation, tools: &[ToolDefinition]) -> Completion {
    let t = (!tools.is_empty()).then_some(tools);
    let parsed = parse_output(&g.text, t);
    let (content, calls) = if parsed.error.is_none() && !parsed.calls.is_empty() {
        (parsed.content, parsed.calls)
    } else {
        (g.text.clone(), vec![])
    };
    let finish = if !calls.is_empty() {
        "tool_calls"
    } else if g.finish_reason == FinishReason::Length {
        "length"
    } else {
        "stop"
    };
    Completion {
        content,
        calls,
        finish,
        prompt_tokens: g.prompt_tokens,
        completion_tokens: g.generated_tokens,
        cached_tokens: g.cached_prompt_tokens,
    }
}

async fn prepare(st: &Arc<AppState>, body: &Value) -> ApiResult<Prepared> {
    let key = body
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad("`model` is required"))?
        .to_string();
    st.check_model(&key)?;
    let messages = convert_messages(body.get("messages").unwrap_or(&Value::Null))?;
    let mut tools = parse_tools(body.get("tools"))?;
    match body.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "auto" => {}
        Some(Value::String(s)) if s == "none" => tools.clear(),
        Some(other) => {
            return Err(ApiError::bad(format!(
                "`tool_choice` {other} is not supported; use \"auto\" or \"none\""
            )));
        }
    }
    let max_tokens = match body
        .get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"))
    {
        None | Some(Value::Null) => 512.min(st.cfg.max_tokens_cap),
        Some(v) => {
            let n = v
                .as_u64()
                .ok_or_else(|| ApiError::bad("`max_tokens` must be a positive integer"))?
                as usize;
            if n == 0 || n > st.cfg.max_tokens_cap {
                return Err(ApiError::bad(format!(
                    "`max_tokens` must be between 1 and {}",
                    st.cfg.max_tokens_cap
                )));
            }
            n
        }
    };
    let spec = st.registry.spec(&key)?.clone();
    if spec.is_demo() {
        // The demo is scripted by step: the step is the number of assistant turns so far.
        let step = messages.iter().filter(|m| m.role == "assistant").count();
        let mut p = DemoPolicy::new(&key, &EpisodeConfig::with_tools(tools));
        let mut last = None;
        for _ in 0..=step {
            last = Some(
                p.act(Observation::Text(
                    messages
                        .last()
                        .map(|m| m.content.clone())
                        .unwrap_or_default(),
                ))?,
            );
        }
        let s = last.expect("at least one step");
        let (content, calls) = match s.action {
            Action::Call { calls, content } => (content, calls),
            Action::Reply { content } => (content, vec![]),
            Action::Invalid { raw, .. } => (raw, vec![]),
        };
        let finish = if calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        return Ok(Prepared::Done(
            key,
            Completion {
                content,
                calls,
                finish,
                prompt_tokens: 0,
                completion_tokens: 0,
                cached_tokens: 0,
            },
        ));
    }
    let model = {
        let st = st.clone();
        let key = key.clone();
        tokio::task::spawn_blocking(move || st.registry.model(&key))
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    e.to_string(),
                )
            })??
    };
    let t = (!tools.is_empty()).then_some(tools.as_slice());
    let prompt = model.template().render(
        &messages,
        t,
        RenderOptions {
            add_generation_prompt: true,
            enable_thinking: Some(spec.enable_thinking),
        },
    )?;
    let engine = model.engine().clone();
    let ids = engine.tokenize(&prompt)?;
    let g = model.generation_config();
    let temperature = match body.get("temperature") {
        Some(v) if !v.is_null() => {
            v.as_f64()
                .ok_or_else(|| ApiError::bad("`temperature` must be a number"))? as f32
        }
        _ => g.temperature.filter(|_| g.do_sample).unwrap_or(0.0),
    };
    let top_p = body
        .get("top_p")
        .and_then(Value::as_f64)
        .map(|p| p as f32)
        .or(g.top_p);
    let seed = body
        .get("seed")
        .and_then(Value::as_u64)
        .unwrap_or_else(|| st.next_id.fetch_add(1, Ordering::Relaxed));
    let stop: Vec<String> = match body.get("stop") {
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::bad("`stop` must be a string or a list of strings"))
            })
            .collect::<ApiResult<_>>()?,
        Some(_) => {
            return Err(ApiError::bad(
                "`stop` must be a string or a list of strings",
            ));
        }
    };
    let mut req = GenerationRequest::new(ids)
        .max_new_tokens(max_tokens)
        .sampling(SamplingParams {
            temperature,
            top_k: g.top_k,
            top_p,
            seed,
        });
    req.stop = stop;
    Ok(Prepared::Model {
        key,
        engine,
        request: req,
        tools,
    })
}

fn tool_calls_json(st: &AppState, calls: &[policy_serve::ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"index": i, "id": st.id("call"), "type": "function", "function": {"name": c.name, "arguments": Value::Object(c.arguments.clone()).to_string()}}))
        .collect()
}

fn usage(c: &Completion) -> Value {
    json!({"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens, "total_tokens": c.prompt_tokens + c.completion_tokens, "prompt_tokens_details": {"cached_tokens": c.cached_tokens}})
}

/// What every chunk of one streamed completion shares.
#[derive(Clone)]
struct ChunkMeta {
    id: String,
    created: u64,
    key: String,
    include_usage: bool,
}

impl ChunkMeta {
    fn chunk(&self, delta: Value, finish: Value) -> String {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.key,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]})
        .to_string()
    }

    /// The closing chunks of a completion: tool calls or the rest of the content, the finish
    /// reason, usage when asked for, `[DONE]`.
    fn closing(&self, st: &AppState, c: &Completion, rest_of_content: &str) -> Vec<String> {
        let mut out = Vec::new();
        if !rest_of_content.is_empty() {
            out.push(self.chunk(json!({"content": rest_of_content}), Value::Null));
        }
        if !c.calls.is_empty() {
            out.push(self.chunk(
                json!({"tool_calls": tool_calls_json(st, &c.calls)}),
                Value::Null,
            ));
        }
        out.push(self.chunk(json!({}), Value::String(c.finish.into())));
        if self.include_usage {
            out.push(json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.key, "choices": [], "usage": usage(c)}).to_string());
        }
        out.push("[DONE]".into());
        out
    }
}

fn count(st: &AppState, c: &Completion) {
    st.counters
        .prompt_tokens
        .fetch_add(c.prompt_tokens as u64, Ordering::Relaxed);
    st.counters
        .completion_tokens
        .fetch_add(c.completion_tokens as u64, Ordering::Relaxed);
    st.counters
        .cached_tokens
        .fetch_add(c.cached_tokens as u64, Ordering::Relaxed);
}

/// How much of the text so far may go out as content: everything before a `<tool_call>`, and
/// not a trailing piece that could still grow into one.
fn visible_content(text: &str) -> usize {
    const OPEN: &str = policy_serve::policy::format::TOOL_CALL_OPEN;
    if let Some(at) = text.find(OPEN) {
        return text[..at].trim_end().len();
    }
    let mut keep = text.len();
    for k in (1..OPEN.len()).rev() {
        if text.len() >= k
            && text.is_char_boundary(text.len() - k)
            && OPEN.starts_with(&text[text.len() - k..])
        {
            keep = text.len() - k;
            break;
        }
    }
    keep
}

struct Streaming {
    st: Arc<AppState>,
    meta: ChunkMeta,
    pending: Option<policy_serve::engine::Pending<policy_serve::Generation>>,
    stream: policy_serve::engine::TokenStream,
    tools: Vec<ToolDefinition>,
    text: String,
    emitted: usize,
    queue: std::collections::VecDeque<String>,
}

/// Token-by-token SSE for a model: content deltas as the text arrives (held back from the first
/// `<tool_call>`), then the parsed tool calls, the finish reason and usage. Dropping the
/// response (client gone) drops the pending generation, which cancels it in the engine.
fn stream_model(
    st: Arc<AppState>,
    meta: ChunkMeta,
    engine: policy_serve::Engine,
    request: GenerationRequest,
    tools: Vec<ToolDefinition>,
) -> Response {
    let (pending, stream) = engine.submit_streaming(request);
    let mut queue = std::collections::VecDeque::new();
    queue.push_back(meta.chunk(json!({"role": "assistant", "content": ""}), Value::Null));
    let state = Streaming {
        st,
        meta,
        pending: Some(pending),
        stream,
        tools,
        text: String::new(),
        emitted: 0,
        queue,
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(data) = s.queue.pop_front() {
                return Some((Ok::<_, Infallible>(Event::default().data(data)), s));
            }
            s.pending.as_ref()?;
            match s.stream.next_chunk().await {
                Some(chunk) => {
                    s.text.push_str(&chunk);
                    let vis = visible_content(&s.text).max(s.emitted);
                    if vis > s.emitted {
                        s.queue.push_back(
                            s.meta
                                .chunk(json!({"content": &s.text[s.emitted..vis]}), Value::Null),
                        );
                        s.emitted = vis;
                    }
                }
                None => {
                    let pending = s.pending.take().expect("checked above");
                    match pending.await {
                        Ok(g) => {
                            let c = to_completion(&g, &s.tools);
                            count(&s.st, &c);
                            // With tool calls, content is the text around them (already sent up
                            // to the first call); without, the whole text.
                            let rest = if c.calls.is_empty() {
                                g.text.get(s.emitted..).unwrap_or("").to_string()
                            } else {
                                String::new()
                            };
                            s.queue.extend(s.meta.closing(&s.st, &c, &rest));
                        }
                        Err(e) => {
                            s.st.counters.errors.fetch_add(1, Ordering::Relaxed);
                            s.queue.push_back(json!({"error": {"message": e.to_string(), "type": "server_error"}}).to_string());
                            s.queue.push_back("[DONE]".into());
                        }
                    }
                }
            }
        }
    });
    Sse::new(events).into_response()
}

async fn chat(State(st): State<Arc<AppState>>, body: Bytes) -> ApiResult<Response> {
    st.counters.chat.fetch_add(1, Ordering::Relaxed);
    let body = parse_body(&body)?;
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let prepared = prepare(&st, &body).await.inspect_err(|_| {
        st.counters.errors.fetch_add(1, Ordering::Relaxed);
    })?;
    let meta = ChunkMeta {
        id: st.id("chatcmpl"),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        key: match &prepared {
            Prepared::Done(k, _) | Prepared::Model { key: k, .. } => k.clone(),
        },
        include_usage: body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };
    let c = match prepared {
        Prepared::Model {
            engine,
            request,
            tools,
            ..
        } if stream => return Ok(stream_model(st.clone(), meta, engine, request, tools)),
        Prepared::Done(_, c) => c,
        Prepared::Model {
            engine,
            request,
            tools,
            ..
        } => {
            let g = engine.submit(request).await.inspect_err(|_| {
                st.counters.errors.fetch_add(1, Ordering::Relaxed);
            })?;
            to_completion(&g, &tools)
        }
    };
    count(&st, &c);
    if stream {
        let mut events = vec![meta.chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
        events.extend(meta.closing(&st, &c, &c.content));
        let sse: Vec<Result<Event, Infallible>> = events
            .into_iter()
            .map(|e| Ok(Event::default().data(e)))
            .collect();
        return Ok(Sse::new(futures_util::stream::iter(sse)).into_response());
    }
    let calls = tool_calls_json(&st, &c.calls);
    let content = if c.content.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        Value::String(c.content.clone())
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        let without_index: Vec<Value> = calls
            .into_iter()
            .map(|mut c| {
                c.as_object_mut().map(|o| o.remove("index"));
                c
            })
            .collect();
        message["tool_calls"] = Value::Array(without_index);
    }
    let resp = json!({"id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.key,
        "choices": [{"index": 0, "message": message, "finish_reason": c.finish, "logprobs": null}], "usage": usage(&c)});
    Ok(Json(resp).into_response())
}

async fn create_episode(
    State(st): State<Arc<AppState>>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let body = parse_body(&body)?;
    let key = body
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad("`model` is required"))?
        .to_string();
    st.check_model(&key)?;
    let max_new_tokens = match body.get("max_tokens").and_then(Value::as_u64) {
        Some(n) if n == 0 || n as usize > st.cfg.max_tokens_cap => {
            return Err(ApiError::bad(format!(
                "`max_tokens` must be between 1 and {}",
                st.cfg.max_tokens_cap
            )));
        }
        n => n.map(|n| n as usize),
    };
    let episode = EpisodeConfig {
        system_prompt: body
            .get("system_prompt")
            .and_then(Value::as_str)
            .map(str::to_string),
        tools: parse_tools(body.get("tools"))?,
        max_new_tokens,
        temperature: body
            .get("temperature")
            .and_then(Value::as_f64)
            .map(|t| t as f32),
        seed: body.get("seed").and_then(Value::as_u64),
        transcript_mode: match body.get("transcript_mode").and_then(Value::as_str) {
            Some("append_only") => policy_serve::TranscriptMode::AppendOnly,
            None | Some("template") => policy_serve::TranscriptMode::Template,
            Some(other) => {
                return Err(ApiError::bad(format!(
                    "`transcript_mode` `{other}`: use \"template\" or \"append_only\""
                )));
            }
        },
    };
    if st.episodes.lock().len() >= st.cfg.max_episodes {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_episodes",
            format!(
                "{} episodes are open; DELETE finished ones",
                st.cfg.max_episodes
            ),
        ));
    }
    let policy = {
        let st = st.clone();
        let key = key.clone();
        tokio::task::spawn_blocking(move || st.registry.get_policy(&key, episode))
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    e.to_string(),
                )
            })??
    };
    let id = st.id("ep");
    st.episodes.lock().insert(
        id.clone(),
        Episode {
            policy: Arc::new(Mutex::new(policy)),
            last_used: Instant::now(),
        },
    );
    Ok((StatusCode::CREATED, Json(json!({"id": id, "model": key}))))
}

async fn act(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    st.counters.acts.fetch_add(1, Ordering::Relaxed);
    let body = parse_body(&body)?;
    let observation = match body.get("observation") {
        Some(Value::String(s)) => Observation::Text(s.clone()),
        Some(Value::Array(a)) => Observation::ToolResults(
            a.iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string())
                })
                .collect(),
        ),
        _ => {
            return Err(ApiError::bad(
                "`observation` must be a string or a list of strings (one per tool call)",
            ));
        }
    };
    let policy = {
        let mut eps = st.episodes.lock();
        let ttl = Duration::from_secs(st.cfg.episode_ttl_secs);
        let e = eps
            .get_mut(&id)
            .filter(|e| e.last_used.elapsed() < ttl)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    "episode_not_found",
                    format!("episode `{id}` does not exist or expired"),
                )
            })?;
        e.last_used = Instant::now();
        e.policy.clone()
    };
    let step = tokio::task::spawn_blocking(move || policy.lock().act(observation))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                e.to_string(),
            )
        })??;
    st.counters
        .prompt_tokens
        .fetch_add(step.cost.prompt_tokens as u64, Ordering::Relaxed);
    st.counters
        .completion_tokens
        .fetch_add(step.cost.generated_tokens as u64, Ordering::Relaxed);
    st.counters
        .cached_tokens
        .fetch_add(step.cost.cached_prompt_tokens as u64, Ordering::Relaxed);
    Ok(Json(json!({
        "action": step.action,
        "raw": step.raw,
        "cost": {"prompt_tokens": step.cost.prompt_tokens, "cached_prompt_tokens": step.cost.cached_prompt_tokens,
                 "generated_tokens": step.cost.generated_tokens, "latency_ms": step.cost.latency.as_secs_f64() * 1e3}
    })))
}

async fn delete_episode(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    match st.episodes.lock().remove(&id) {
        Some(_) => Ok(StatusCode::NO_CONTENT),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "episode_not_found",
            format!("episode `{id}` does not exist"),
        )),
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let c = &st.counters;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in rows {
            out.push_str(&format!("{name}{labels} {v}\n"));
        }
    };
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    metric(
        "policy_serve_requests_total",
        "counter",
        "Requests by route.",
        vec![
            ("{route=\"chat_completions\"}".into(), get(&c.chat)),
            ("{route=\"episode_act\"}".into(), get(&c.acts)),
        ],
    );
    metric(
        "policy_serve_request_errors_total",
        "counter",
        "Chat requests that failed.",
        vec![(String::new(), get(&c.errors))],
    );
    metric(
        "policy_serve_tokens_total",
        "counter",
        "Tokens by kind.",
        vec![
            ("{kind=\"prompt\"}".into(), get(&c.prompt_tokens)),
            ("{kind=\"completion\"}".into(), get(&c.completion_tokens)),
            ("{kind=\"cached_prompt\"}".into(), get(&c.cached_tokens)),
        ],
    );
    metric(
        "policy_serve_episodes_open",
        "gauge",
        "Open episodes.",
        vec![(String::new(), st.episodes.lock().len() as f64)],
    );
    let mut hit = vec![];
    let mut queue = vec![];
    let mut running = vec![];
    for key in &st.offered {
        if st.registry.is_loaded(key)
            && let Ok(m) = st.registry.model(key)
        {
            let s = m.engine().stats();
            hit.push((format!("{{model=\"{key}\"}}"), s.cache_hit_rate));
            queue.push((format!("{{model=\"{key}\"}}"), s.waiting as f64));
            running.push((format!("{{model=\"{key}\"}}"), s.running as f64));
        }
    }
    metric(
        "policy_serve_cache_hit_rate",
        "gauge",
        "Prefix-cache hit rate (prompt tokens).",
        hit,
    );
    metric(
        "policy_serve_queue_depth",
        "gauge",
        "Requests waiting for admission.",
        queue,
    );
    metric(
        "policy_serve_running_sequences",
        "gauge",
        "Sequences decoding.",
        running,
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// Binds and serves until Ctrl-C.
pub async fn run(cfg: Config) -> Result<(), Box<dyn std::error::Error>> {
    if !cfg.addr.ip().is_loopback() {
        tracing::warn!(addr = %cfg.addr, token = cfg.token.is_some(), "listening beyond loopback");
    }
    let state = AppState::new(cfg.clone())?;
    if cfg.preload {
        preload(&state);
    }
    spawn_sweeper(&state);
    let listener = tokio::net::TcpListener::bind(cfg.addr).await?;
    println!(
        "policy-serve listening on http://{} (models: {})",
        listener.local_addr()?,
        state.offered.join(", ")
    );
    axum::serve(listener, app(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    if let Err(e) = run(Config::parse()).await {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
