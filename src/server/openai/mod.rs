//! Typed requests of the HTTP host and their one validation path.
//!
//! Chat completions and episode creation share [`GenerationFields`] (max_tokens, temperature,
//! top_p, seed): both validate them with [`GenerationFields::validate`] and both turn them
//! into sampling with [`SamplingParams::resolve`](crate::engine::SamplingParams::resolve), so
//! the two routes refuse the same values with the same message and decode with the same
//! defaults. Every other chat field is checked by [`ChatRequest::validate`], the same way for
//! every model, the demo included; each error names its field (`param`).

mod chat;
mod fields;
mod requests;

pub use chat::{ChatParams, ChatRequest, Unserved};
pub use fields::{
    Generation, GenerationFields, flag, model_key, parse, parse_stop, parse_tools, string_field,
};
pub use requests::{ActRequest, EpisodeRequest, convert_messages};
