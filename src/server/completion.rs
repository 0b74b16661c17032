//! [`Completion`]: the OpenAI view of a finished answer (content or tool calls, finish
//! reason, token counts), shared by the plain and the streamed chat response; and how
//! `logprobs` name tokens and write values, shared by chat and text completions.

use serde_json::{Value, json};

use super::state::random_id;
use crate::engine::FinishReason;
use crate::policy::format::{ToolDefinition, parse_output};
use crate::{Generation, ToolCall};

/// The OpenAI view of a finished answer.
pub(super) struct Completion {
    pub(super) content: String,
    pub(super) calls: Vec<ToolCall>,
    pub(super) finish: &'static str,
    pub(super) prompt_tokens: usize,
    pub(super) completion_tokens: usize,
    pub(super) cached_tokens: usize,
    /// Of `cached_tokens`, those loaded back from the host and the disk KV tiers.
    pub(super) tier_tokens: (usize, usize),
    /// The weights that produced it (`None`: the demo).
    pub(super) weights_version: Option<crate::engine::WeightsVersion>,
}

/// Turns a finished generation into the OpenAI view: tool calls when the output parses into
/// valid calls, the raw text otherwise.
pub(super) fn to_completion(g: &Generation, tools: &[ToolDefinition]) -> Completion {
    let t = (!tools.is_empty()).then_some(tools);
    let parsed = parse_output(&g.text, t);
    let (content, calls) = if parsed.error.is_none() && !parsed.calls.is_empty() {
        (parsed.content, parsed.calls)
    } else {
        (g.text.clone(), vec![])
    };
    let finish = if !calls.is_empty() && g.finish_reason != FinishReason::Interrupted {
        "tool_calls"
    } else {
        g.finish_reason.as_openai()
    };
    Completion {
        content,
        calls,
        finish,
        prompt_tokens: g.prompt_tokens,
        completion_tokens: g.generated_tokens,
        cached_tokens: g.cached_prompt_tokens,
        tier_tokens: (g.cached_prompt_tokens_host, g.cached_prompt_tokens_disk),
        weights_version: Some(g.weights_version.clone()),
    }
}

/// The OpenAI `tool_calls` of `calls` (each with its index and a fresh id).
pub(super) fn tool_calls_json(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"index": i, "id": random_id("call"), "type": "function", "function": {"name": c.name, "arguments": Value::Object(c.arguments.clone()).to_string()}}))
        .collect()
}

/// The OpenAI `usage` object of a completion.
pub(super) fn usage(c: &Completion) -> Value {
    json!({"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens, "total_tokens": c.prompt_tokens + c.completion_tokens, "prompt_tokens_details": {"cached_tokens": c.cached_tokens, "cached_tokens_host": c.tier_tokens.0, "cached_tokens_disk": c.tier_tokens.1}})
}

/// A token's name in `logprobs`: `token_id:N` when asked (vLLM's
/// `return_tokens_as_token_ids`), else its text.
pub(super) fn token_name(engine: &crate::engine::Engine, t: u32, as_id: bool) -> String {
    if as_id {
        format!("token_id:{t}")
    } else {
        engine.tokenizer().decode(&[t], false).unwrap_or_default()
    }
}

/// A log-probability as JSON: `-inf` (a token outside top-k / min-p / top-p) as vLLM sends
/// it, -9999.0.
pub(super) fn logprob_json(v: f32) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        json!(-9999.0)
    }
}
