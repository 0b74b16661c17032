//! [`Config`]: the server's settings, which are also the flags of `examples/serve.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::engine::EngineFlags;

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
    /// Serve a PEFT LoRA adapter as model NAME over model BASE_KEY: NAME=BASE_KEY:DIR
    /// (repeatable; the base loads once and takes every adapter's requests in its batches).
    #[arg(long = "adapter", value_parser = parse_adapter)]
    pub adapters: Vec<(String, String, PathBuf)>,
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
    /// Accept new weights: `POST /v1/models/{key}/weights` (from disk) and the NCCL weight
    /// transfer a trainer drives (`/init_weight_transfer_engine`, `/start_weight_update`,
    /// `/update_weights`, `/finish_weight_update`). Off: those routes answer 403. Beyond
    /// loopback it needs `--token`.
    #[arg(long)]
    pub allow_weight_updates: bool,
}

fn parse_adapter(s: &str) -> Result<(String, String, PathBuf), String> {
    let (name, rest) = s.split_once('=').ok_or("expected NAME=BASE_KEY:DIR")?;
    let (base, dir) = rest.split_once(':').ok_or("expected NAME=BASE_KEY:DIR")?;
    if name.is_empty() || base.is_empty() || dir.is_empty() {
        return Err("expected NAME=BASE_KEY:DIR, each part non-empty".into());
    }
    Ok((name.to_string(), base.to_string(), dir.into()))
}

fn parse_key_dir(s: &str) -> Result<(String, PathBuf), String> {
    let (k, d) = s.split_once('=').ok_or("expected KEY=DIR")?;
    Ok((k.to_string(), d.into()))
}
