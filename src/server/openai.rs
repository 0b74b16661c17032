//! Typed requests of the HTTP host and their one validation path.
//!
//! Chat completions and episode creation share [`GenerationFields`] (max_tokens, temperature,
//! top_p, seed): both validate them with [`GenerationFields::validate`] and both turn them
//! into sampling with [`SamplingParams::resolve`], so the two routes refuse the same values
//! with the same message and decode with the same defaults.

use serde::Deserialize;
use serde_json::Value;

use super::error::{ApiError, ApiResult};
use crate::engine::{GenerationConfig, SamplingParams};
use crate::policy::format::{Message, ToolDefinition};

/// The generation fields chat and episodes share, as sent (checked by `validate`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenerationFields {
    /// Cap on generated tokens.
    #[serde(default)]
    pub max_tokens: Option<Value>,
    /// OpenAI's newer name for `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<Value>,
    /// Sampling temperature (0: greedy).
    #[serde(default)]
    pub temperature: Option<Value>,
    /// Nucleus mass.
    #[serde(default)]
    pub top_p: Option<Value>,
    /// Sampling seed.
    #[serde(default)]
    pub seed: Option<Value>,
}

/// [`GenerationFields`] after validation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Generation {
    /// Cap on generated tokens (`None`: the route's default).
    pub max_tokens: Option<usize>,
    /// Temperature (`None`: the model's default).
    pub temperature: Option<f32>,
    /// Top-p (`None`: the model's default).
    pub top_p: Option<f32>,
    /// Seed (`None`: a fresh one).
    pub seed: Option<u64>,
}

impl Generation {
    /// The sampling of a request with these fields on a model with these defaults.
    pub fn sampling(&self, defaults: &GenerationConfig, fresh_seed: u64) -> SamplingParams {
        SamplingParams::resolve(
            defaults,
            self.temperature,
            self.top_p,
            self.seed.unwrap_or(fresh_seed),
        )
    }
}

fn present(v: &Option<Value>) -> Option<&Value> {
    v.as_ref().filter(|v| !v.is_null())
}

fn number(param: &'static str, v: &Value, lo: f64, hi: f64) -> ApiResult<f32> {
    match v.as_f64() {
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x as f32),
        _ => Err(ApiError::field(
            param,
            format!("`{param}` must be a number between {lo} and {hi}, got {v}"),
        )),
    }
}

impl GenerationFields {
    /// Checks every field; the error names the field (`param`). `max_tokens_cap` bounds
    /// `max_tokens`.
    pub fn validate(&self, max_tokens_cap: usize) -> ApiResult<Generation> {
        let max_tokens = match present(&self.max_tokens).or(present(&self.max_completion_tokens)) {
            None => None,
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 && n as usize <= max_tokens_cap => Some(n as usize),
                _ => {
                    return Err(ApiError::field(
                        "max_tokens",
                        format!(
                            "`max_tokens` must be an integer between 1 and {max_tokens_cap}, got {v}"
                        ),
                    ));
                }
            },
        };
        let temperature = present(&self.temperature)
            .map(|v| number("temperature", v, 0.0, 2.0))
            .transpose()?;
        let top_p = present(&self.top_p)
            .map(|v| number("top_p", v, 0.0, 1.0))
            .transpose()?;
        if top_p == Some(0.0) {
            return Err(ApiError::field(
                "top_p",
                "`top_p` must be above 0 (use temperature 0 for greedy decoding)",
            ));
        }
        let seed = match present(&self.seed) {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .or_else(|| v.as_i64().map(|i| i as u64))
                    .ok_or_else(|| {
                        ApiError::field("seed", format!("`seed` must be an integer, got {v}"))
                    })?,
            ),
        };
        Ok(Generation {
            max_tokens,
            temperature,
            top_p,
            seed,
        })
    }
}

/// `stream_options` of a chat request.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// Model key (required).
    #[serde(default)]
    pub model: Option<String>,
    /// OpenAI messages (converted by [`convert_messages`]).
    #[serde(default)]
    pub messages: Value,
    /// OpenAI tools.
    #[serde(default)]
    pub tools: Option<Value>,
    /// `"auto"` or `"none"`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Stop strings: a string or a list.
    #[serde(default)]
    pub stop: Option<Value>,
    /// Stream SSE chunks.
    #[serde(default)]
    pub stream: Option<Value>,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Number of choices (only 1).
    #[serde(default)]
    pub n: Option<Value>,
    /// vLLM's extension: keep generating past EOS (benchmarks with fixed output lengths).
    #[serde(default)]
    pub ignore_eos: Option<Value>,
    /// vLLM's extension: generate at least this many tokens.
    #[serde(default)]
    pub min_tokens: Option<Value>,
    /// The shared generation fields.
    #[serde(flatten)]
    pub generation: GenerationFields,
}

/// `POST /v1/episodes`.
#[derive(Debug, Clone, Deserialize)]
pub struct EpisodeRequest {
    /// Model key (required).
    #[serde(default)]
    pub model: Option<String>,
    /// System prompt.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// OpenAI tools.
    #[serde(default)]
    pub tools: Option<Value>,
    /// `"template"` (default) or `"append_only"`.
    #[serde(default)]
    pub transcript_mode: Option<String>,
    /// The shared generation fields.
    #[serde(flatten)]
    pub generation: GenerationFields,
}

/// `POST /v1/episodes/{id}/act`.
#[derive(Debug, Clone, Deserialize)]
pub struct ActRequest {
    /// The task (first act), or tool results: a string, or a list (one per tool call).
    #[serde(default)]
    pub observation: Value,
}

/// Parses a JSON body into a request type; the error says what is wrong.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))?;
    serde_json::from_value(v).map_err(|e| ApiError::bad(format!("invalid request: {e}")))
}

/// The model key of a request.
pub fn require_model(model: &Option<String>) -> ApiResult<String> {
    model
        .clone()
        .ok_or_else(|| ApiError::field("model", "`model` is required"))
}

/// The tools of a request (none when absent).
pub fn parse_tools(v: Option<&Value>) -> ApiResult<Vec<ToolDefinition>> {
    match v {
        None | Some(Value::Null) => Ok(vec![]),
        Some(t) => ToolDefinition::list_from_json(&t.to_string())
            .map_err(|e| ApiError::field("tools", format!("`tools`: {e}"))),
    }
}

/// OpenAI messages -> template messages: content parts joined, string tool arguments decoded
/// to objects (so the template renders them as in training, with `tojson`).
pub fn convert_messages(v: &Value) -> ApiResult<Vec<Message>> {
    let list = v
        .as_array()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| ApiError::field("messages", "`messages` must be a non-empty list"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let mut m = m.clone();
        if let Some(parts) = m.get("content").and_then(Value::as_array) {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text") | None, Some(Value::String(t))) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::field(
                            "messages",
                            format!(
                                "messages[{i}].content[{j}]: only text parts are supported, got type {}",
                                kind.unwrap_or("(none)")
                            ),
                        ));
                    }
                }
            }
            m["content"] = Value::String(text);
        }
        if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for c in calls {
                if let Some(args) = c.pointer_mut("/function/arguments")
                    && let Some(s) = args.as_str()
                    && let Ok(obj @ Value::Object(_)) = serde_json::from_str::<Value>(s)
                {
                    *args = obj;
                }
            }
        }
        let msg: Message = serde_json::from_value(m)
            .map_err(|e| ApiError::field("messages", format!("messages[{i}]: {e}")))?;
        if !["system", "user", "assistant", "tool"].contains(&msg.role.as_str()) {
            return Err(ApiError::field(
                "messages",
                format!("messages[{i}]: unknown role `{}`", msg.role),
            ));
        }
        out.push(msg);
    }
    Ok(out)
}

/// Stop strings: absent, a string, or a list of strings.
pub fn parse_stop(v: Option<&Value>) -> ApiResult<Vec<String>> {
    let bad = || ApiError::field("stop", "`stop` must be a string or a list of strings");
    match v {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or_else(bad))
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// A boolean field (absent: false).
pub fn flag(param: &'static str, v: Option<&Value>) -> ApiResult<bool> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::field(
            param,
            format!("`{param}` must be true or false, got {other}"),
        )),
    }
}
