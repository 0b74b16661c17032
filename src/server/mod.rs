//! The HTTP host (feature `server`): OpenAI-compatible chat completions with tools (and SSE
//! streaming), an episodes API for harnesses, health and Prometheus metrics, over a
//! [`ModelRegistry`](crate::ModelRegistry).
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
//! `/health` needs `Authorization: Bearer <token>`. New weights (from disk, or pushed by a
//! trainer over NCCL as vLLM takes them) only with `--allow-weight-updates`.

mod app;
mod chat;
mod completion;
mod completions;
mod config;
mod episodes;
pub mod error;
mod metrics;
mod middleware;
pub mod openai;
mod rl;
mod state;
mod stream;
mod weights;
mod wire;

pub use app::{preload, router, serve, serve_on, spawn_sweeper};
pub use config::Config;
pub use error::{ApiError, ApiResult};
pub use state::AppState;
