//! Policies: what a host steps through an episode.
//!
//! A [`Policy`] receives observations (first the task, then tool results) and returns a
//! [`Step`] per call: the [`Action`] it takes, the raw text behind it, and its costs. Every
//! policy formats through [`format`](mod@format), the single source of truth.

mod demo;
mod episode;
pub mod format;
mod model;

pub use demo::DemoPolicy;
pub use episode::{Action, EpisodeConfig, Observation, Policy, Step, StepCost, TranscriptMode};
pub use format::{Message, ToolCall, ToolDefinition};
pub use model::{ModelPolicy, PolicyModel};
