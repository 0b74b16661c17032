//! [`AppState`]: what every handler shares (the registry, the offered models, the open
//! episodes, the counters), and the helpers every handler uses (`blocking`, `random_id`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use parking_lot::Mutex;

use super::config::Config;
use super::error::{ApiError, ApiResult};
use crate::engine::parallel::transfer::TrainerLink;
use crate::engine::{CancelToken, HostTensor};
use crate::error::Error;
use crate::policy::Policy;
use crate::registry::{ModelRegistry, ModelSpec};

/// One open episode: its policy and when it was last used.
pub(super) struct Episode {
    pub(super) policy: Arc<Mutex<Box<dyn Policy>>>,
    /// When the last act ended (or the episode was created): its idle time starts here.
    pub(super) last_used: Instant,
    /// The acts running now, each by its cancel token (DELETE cancels them). An episode with
    /// a running act is never expired.
    pub(super) acts: Vec<CancelToken>,
}

impl Episode {
    /// Whether the episode has been idle (no act running) for `ttl` or longer.
    pub(super) fn expired(&self, ttl: Duration) -> bool {
        self.acts.is_empty() && self.last_used.elapsed() >= ttl
    }
}

/// Request and token counters (`/metrics`).
#[derive(Default)]
pub(super) struct Counters {
    pub(super) chat: AtomicU64,
    pub(super) completions: AtomicU64,
    pub(super) acts: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) prompt_tokens: AtomicU64,
    pub(super) completion_tokens: AtomicU64,
    pub(super) cached_tokens: AtomicU64,
}

impl Counters {
    pub(super) fn tokens(&self, prompt: usize, completion: usize, cached: usize) {
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(completion as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(cached as u64, Ordering::Relaxed);
    }
}

/// A trainer's weight-sync group and the update in progress (the routes: `weights.rs`).
pub(super) struct TransferSession {
    /// The model the weights are for.
    pub(super) key: String,
    pub(super) link: TrainerLink,
    pub(super) packed: bool,
    pub(super) buffer_bytes: usize,
    /// Tensors received since `/start_weight_update`.
    pub(super) staged: Vec<HostTensor>,
    /// Why the update in progress was refused (it is then not applied).
    pub(super) aborted: Option<String>,
}

/// Shared server state: the registry, the open episodes, the counters.
pub struct AppState {
    pub(super) registry: ModelRegistry,
    pub(super) offered: Vec<String>,
    pub(super) cfg: Config,
    pub(super) episodes: Mutex<HashMap<String, Episode>>,
    /// Episode slots reserved by creates still loading (counted against the cap).
    pub(super) reserved_episodes: std::sync::atomic::AtomicUsize,
    pub(super) loading: Mutex<Vec<String>>,
    pub(super) counters: Counters,
    pub(super) next_id: AtomicU64,
    /// A trainer's weight-sync group, once joined (`weights.rs`).
    pub(super) transfer: Arc<Mutex<Option<TransferSession>>>,
}

impl AppState {
    /// Builds the state: the default registry, re-pointed and filtered as configured.
    pub fn new(cfg: Config) -> Result<Arc<Self>, Error> {
        if cfg.allow_weight_updates && cfg.token.is_none() && !cfg.addr.ip().is_loopback() {
            return Err(Error::InvalidInput(format!(
                "--allow-weight-updates on {} (beyond loopback) needs --token: anyone who can reach the port could replace the weights",
                cfg.addr
            )));
        }
        let options = cfg.engine.options();
        let mut registry = ModelRegistry::with_defaults()
            .with_options(options)
            .with_load_backoff(Duration::from_secs(cfg.load_backoff_secs));
        for (k, d) in &cfg.model_dirs {
            super::error::register_private_dir(d);
            if let Ok(abs) = std::path::absolute(d) {
                super::error::register_private_dir(&abs);
            }
            registry = match registry.spec(k) {
                Ok(_) => registry.with_local_dir(k, d)?,
                Err(_) => registry.with_model(ModelSpec::local(k, k, d)),
            };
        }
        for (name, base, dir) in &cfg.adapters {
            super::error::register_private_dir(dir);
            registry.spec(base)?;
            let spec = ModelSpec::adapter(name, name, base, crate::ModelSource::Local(dir.clone()))
                .thinking(registry.spec(base)?.enable_thinking);
            registry = registry.with_model(spec);
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
            transfer: Arc::new(Mutex::new(None)),
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
    pub(super) fn fresh_seed(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The spec of `key` if it is offered, available and not loading; a typed error otherwise.
    pub(super) fn check_model(&self, key: &str) -> ApiResult<ModelSpec> {
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
pub(super) fn random_id(prefix: &str) -> String {
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
pub(super) async fn blocking<T: Send + 'static>(
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
