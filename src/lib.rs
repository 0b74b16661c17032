//! # policy-serve
//!
//! An embeddable engine that serves tool-calling LLM policies (Qwen3 family) to host
//! programs: RL and evaluation harnesses, app backends, agents.
//!
//! A [`ModelRegistry`] lists selectable models (a scripted demo first and default) and loads
//! each at most once per process; [`ModelRegistry::get_policy`] returns a fresh per-episode
//! [`Policy`]. Every formatting decision (tool schema, chat template, `<tool_call>` parsing)
//! goes through [`policy::format`], byte-identical to Hugging Face `transformers`. Model
//! policies generate on a shared [`Engine`] (candle, CUDA or CPU) that batches concurrent
//! episodes over a paged KV cache.
//!
//! ```
//! use policy_serve::{Action, EpisodeConfig, ModelRegistry, ToolDefinition};
//!
//! let registry = ModelRegistry::with_defaults();
//! let tools = vec![
//!     ToolDefinition::new("query", "Run a SQL query").param("sql", "string", "The query", true),
//!     ToolDefinition::new("answer", "Submit the answer").param("value", "string", "The answer", true),
//! ];
//! let episode = EpisodeConfig::with_tools(tools).system("You answer questions about a database.");
//! // The demo policy needs no download; use "qwen3-0.6b" for the real model.
//! let mut policy = registry.get_policy(registry.default_key(), episode)?;
//! let mut observation = "How many users are there?".to_string();
//! for _ in 0..5 {
//!     let step = policy.act(observation.as_str().into())?;
//!     match step.action {
//!         Action::Call { calls, .. } if calls[0].name == "answer" => break,
//!         Action::Call { calls, .. } => observation = format!("ran {}", calls[0].name),
//!         Action::Reply { .. } | Action::Invalid { .. } => break,
//!     }
//! }
//! # Ok::<(), policy_serve::Error>(())
//! ```

#![warn(missing_docs)]

/// The README's library example, compiled and run as a doc-test.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod cache;
mod digest;
pub mod engine;
mod error;
pub mod grammar;
pub mod policy;
pub mod registry;
#[cfg(feature = "server")]
pub mod server;
#[doc(hidden)]
pub mod testing;

pub use engine::{
    CancelToken, Engine, EngineOptions, Generation, GenerationRequest, KvPin, SamplingParams,
    TokenLogprob,
};
pub use error::{Error, Result};
pub use grammar::{Grammar, GrammarCompiler, GrammarMatcher};
pub use policy::format::{
    ChatTemplate, Message, OutputConstraint, RenderOptions, ResponseFormat, ToolCall, ToolChoice,
    ToolDefinition, parse_output,
};
pub use policy::{
    Action, DemoPolicy, EpisodeConfig, ModelPolicy, Observation, Policy, Step, StepCost,
    TranscriptMode,
};
pub use registry::{LoadedModel, ModelRegistry, ModelSource, ModelSpec};

/// Sends `tracing` logs to stderr, filtered by `RUST_LOG` (else `default_filter`, e.g. "info"),
/// with colour codes only when stderr is a terminal (a log file stays plain text). Does
/// nothing if a global subscriber is already set (a host app's own wins).
pub fn init_logging(default_filter: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
