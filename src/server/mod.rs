//! The HTTP host (feature `server`): OpenAI-compatible chat completions with tools (and SSE
//! streaming), an episodes API for harnesses, health and Prometheus metrics, over a
//! [`ModelRegistry`].
//!
//! Run it with [`serve`], or mount [`router`] in a host app's own axum app:
//!
//! ```no_run
//! use clap::Parser;
//! use policy_serve::server::{AppState, Config, router};
//!
//! # async fn host() -> Result<(), Box<dyn std::error::Error>> {
//! let state = AppState::new(Config::parse_from(["serve", "--models", "demo"]))?;
//! let app = axum::Router::new().nest("/policy", router(state));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Invariants: every error is an OpenAI-style JSON body with the right status; a malformed
//! request never affects another; a client that disconnects drops its pending generation,
//! which frees its sequence in the engine; CPU-heavy work (loading, rendering, tokenizing)
//! runs off the async executor. Loopback by default; with a token set, every route but
//! `/health` needs `Authorization: Bearer <token>`.

mod chat;
mod episodes;
pub mod error;
mod metrics;
mod middleware;
pub mod openai;
mod stream;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use serde_json::json;

pub use error::{ApiError, ApiResult};

use crate::engine::EngineFlags;
use crate::error::Error;
use crate::policy::Policy;
use crate::registry::{ModelRegistry, ModelSpec};

/// Server settings (also the flags of `examples/serve.rs`).
#[derive(clap::Parser, Debug, Clone)]
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
    /// Idle episodes expire after this many seconds (at least 1).
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub episode_ttl_secs: u64,
    /// Cap on an episode's prompt in tokens (a step over it is a 400; the episode stays as it
    /// was). Default: the model's context.
    #[arg(long)]
    pub max_transcript_tokens: Option<usize>,
    /// How every offered model's engine is sized (device, KV memory, batching).
    #[command(flatten)]
    pub engine: EngineFlags,
    /// After a model fails to load, requests for it fail at once (503 `model_load_failed`)
    /// for this many seconds instead of reloading.
    #[arg(long, default_value_t = 30)]
    pub load_backoff_secs: u64,
    /// Seconds a client has to send a request's headers (slow clients are disconnected).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_secs: u64,
    /// Seconds a client has to send a request's body (a stalled body gets a 408).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_secs: u64,
    /// Most open connections; further ones wait to be accepted.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
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

impl Counters {
    fn tokens(&self, prompt: usize, completion: usize, cached: usize) {
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(completion as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(cached as u64, Ordering::Relaxed);
    }
}

/// Shared server state: the registry, the open episodes, the counters.
pub struct AppState {
    registry: ModelRegistry,
    offered: Vec<String>,
    cfg: Config,
    episodes: Mutex<HashMap<String, Episode>>,
    /// Episode slots reserved by creates still loading (counted against the cap).
    reserved_episodes: std::sync::atomic::AtomicUsize,
    loading: Mutex<Vec<String>>,
    counters: Counters,
    next_id: AtomicU64,
}

impl AppState {
    /// Builds the state: the default registry, re-pointed and filtered as configured.
    pub fn new(cfg: Config) -> Result<Arc<Self>, Error> {
        let options = cfg.engine.options();
        let mut registry = ModelRegistry::with_defaults()
            .with_options(options)
            .with_load_backoff(Duration::from_secs(cfg.load_backoff_secs));
        for (k, d) in &cfg.model_dirs {
            registry = match registry.spec(k) {
                Ok(_) => registry.with_local_dir(k, d)?,
                Err(_) => registry.with_model(ModelSpec::local(k, k, d)),
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
            reserved_episodes: std::sync::atomic::AtomicUsize::new(0),
            loading: Mutex::new(Vec::new()),
            counters: Counters::default(),
            next_id: AtomicU64::new(1),
        }))
    }

    /// The registry behind the server.
    pub fn registry(&self) -> &ModelRegistry {
        &self.registry
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// A fresh sampling seed for a request that gives none.
    fn fresh_seed(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The spec of `key` if it is offered, available and not loading; a typed error otherwise.
    fn check_model(&self, key: &str) -> ApiResult<ModelSpec> {
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
        Ok(spec.clone())
    }
}

/// An unguessable id: `prefix-` and 128 random bits (SipHash under per-process random keys).
fn random_id(prefix: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let word = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.finish()
    };
    format!("{prefix}-{:016x}{:016x}", word(), word())
}

/// Runs blocking work (loading, rendering, tokenizing, a policy step) off the async executor.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "a blocking task failed");
            ApiError::internal("an internal task failed")
        })?
        .map_err(ApiError::from)
}

/// The router with every route and limit; mount it in a host app's axum app if you like.
pub fn router(state: Arc<AppState>) -> Router {
    let protected = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/episodes", post(episodes::create))
        .route("/v1/episodes/{id}/act", post(episodes::act))
        .route("/v1/episodes/{id}", delete(episodes::delete))
        .route("/metrics", get(metrics::metrics))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::auth,
        ));
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .merge(protected)
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route; see GET /v1/models, POST /v1/chat/completions, /v1/episodes",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method",
            )
        })
        .layer(DefaultBodyLimit::max(state.cfg.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::body_limit,
        ))
        .with_state(state)
}

async fn models(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let data: Vec<serde_json::Value> = st
        .registry
        .specs()
        .filter(|s| st.offered.contains(&s.key))
        .map(|s| json!({"id": s.key, "object": "model", "created": 0, "owned_by": "policy-serve", "label": s.label, "available": s.available, "loaded": s.is_demo() || st.registry.is_loaded(&s.key)}))
        .collect();
    Json(json!({"object": "list", "data": data}))
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

/// Binds `cfg.addr` and serves until Ctrl-C.
pub async fn serve(cfg: Config) -> Result<(), Box<dyn std::error::Error>> {
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
    serve_on(listener, state, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

/// Serves the router of `state` on `listener` until `shutdown` resolves: HTTP/1.1 with a
/// header-read timeout per connection (`--header-timeout-secs`) and at most
/// `--max-connections` connections at once (more wait to be accepted).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let permits = Arc::new(tokio::sync::Semaphore::new(
        state.cfg.max_connections.min(1 << 20) as usize,
    ));
    let header_timeout = Duration::from_secs(state.cfg.header_timeout_secs);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.map_err(std::io::Error::other)?,
            _ = &mut shutdown => return Ok(()),
        };
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = &mut shutdown => return Ok(()),
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
}
