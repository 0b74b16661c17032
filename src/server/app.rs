//! The router and the listener: every route and limit ([`router`]), background loading
//! ([`preload`]), the episode sweeper, and [`serve`] / [`serve_on`] (HTTP/1.1 with a
//! header-read timeout and a connection cap).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde_json::json;

use super::config::Config;
use super::error::ApiError;
use super::state::AppState;
use super::wire::OpenAiErrors;
use super::{chat, completions, episodes, metrics, middleware, rl, weights};

/// The router with every route and limit; mount it in a host app's axum app if you like.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/completions", post(completions::completions))
        .route("/get_world_size", get(rl::world_size))
        .route("/server_info", get(rl::server_info))
        .route("/reset_prefix_cache", post(rl::reset_prefix_cache))
        .route("/v1/models/{key}/weights", post(weights::from_disk))
        .route("/init_weight_transfer_engine", post(weights::init))
        .route("/start_weight_update", post(weights::start))
        .route("/update_weights", post(weights::update))
        .route("/finish_weight_update", post(weights::finish))
        .route("/v1/episodes", post(episodes::create))
        .route("/v1/episodes/{id}/act", post(episodes::act))
        .route("/v1/episodes/{id}", delete(episodes::delete))
        .route("/metrics", get(metrics::metrics))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route; see GET /v1/models, POST /v1/chat/completions, /v1/completions, /v1/episodes",
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
        // Outermost: the token is checked before routing and before the body is read.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::auth,
        ))
        .with_state(state)
}

async fn models(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let data: Vec<serde_json::Value> = st
        .registry
        .specs()
        .filter(|s| st.offered.contains(&s.key))
        .map(|s| {
            let loaded = (!s.is_demo() && st.registry.is_loaded(&s.key))
                .then(|| st.registry.model(&s.key).ok())
                .flatten();
            // An adapter lists its base as `parent` (vLLM's field) and its version.
            let version = loaded.as_ref().map(|m| crate::engine::WeightsVersion {
                adapter: m.adapter().map(|h| h.version().clone()),
                ..m.engine().stats().weights_version
            });
            json!({"id": s.key, "object": "model", "created": 0, "owned_by": "policy-serve",
                "label": s.label, "available": s.available,
                "parent": s.adapter_of,
                "loaded": s.is_demo() || loaded.is_some(),
                "weights_version": version})
        })
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
            // An episode is never swept while an act runs; its idle time starts when the act
            // ends.
            st.episodes.lock().retain(|_, e| !e.expired(ttl));
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
                .serve_connection(
                    hyper_util::rt::TokioIo::new(OpenAiErrors::new(stream)),
                    service,
                )
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
}
