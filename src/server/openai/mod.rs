//! Typed requests of the HTTP host and their one validation path.
//!
//! Chat completions and episode creation share [`GenerationFields`] (max_tokens, temperature,
//! top_p, seed): both validate them with [`GenerationFields::validate`] and both turn them
//! into sampling with [`SamplingParams::resolve`](crate::engine::SamplingParams::resolve), so
//! the two routes refuse the same values with the same message and decode with the same
//! defaults. Every other chat field is checked by [`ChatRequest::validate`], the same way for
//! every model, the demo included; each error names its field (`param`). Text completions
//! (`/v1/completions`, vLLM's fields for RL trainers) validate through
//! [`CompletionRequest::validate`] on the same shared fields.

mod chat;
mod completions;
mod constraint;
mod fields;
mod requests;

pub use chat::{ChatParams, ChatRequest, MAX_CHOICES, Unserved};
pub use completions::{
    CompletionParams, CompletionRequest, DEFAULT_COMPLETION_TOKENS, Prompts, parse_prompts,
};
pub use constraint::output_constraint;
pub use fields::{
    Generation, GenerationFields, flag, model_key, parse, parse_stop, parse_tools, string_field,
};
pub use requests::{ActRequest, EpisodeRequest, convert_messages};
