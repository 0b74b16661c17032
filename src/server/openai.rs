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
        // Both names are checked when both are given (a bad one is never hidden by a good
        // one); `max_tokens` wins when both are valid.
        let cap = |param: &'static str, v: Option<&Value>| -> ApiResult<Option<usize>> {
            match v {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) if n >= 1 && n as usize <= max_tokens_cap => Ok(Some(n as usize)),
                    _ => Err(ApiError::field(
                        param,
                        format!(
                            "`{param}` must be an integer between 1 and {max_tokens_cap}, got {v}"
                        ),
                    )),
                },
            }
        };
        let max_tokens = cap("max_tokens", present(&self.max_tokens))?;
        let max_completion = cap(
            "max_completion_tokens",
            present(&self.max_completion_tokens),
        )?;
        let max_tokens = max_tokens.or(max_completion);
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

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// Model key (required; a string).
    #[serde(default)]
    pub model: Option<Value>,
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
    /// Streaming options (`{"include_usage": bool}`, with `stream` only).
    #[serde(default)]
    pub stream_options: Option<Value>,
    /// Number of choices (only 1).
    #[serde(default)]
    pub n: Option<Value>,
    /// vLLM's extension: keep generating past EOS (benchmarks with fixed output lengths).
    #[serde(default)]
    pub ignore_eos: Option<Value>,
    /// vLLM's extension: generate at least this many tokens.
    #[serde(default)]
    pub min_tokens: Option<Value>,
    /// Fields of the OpenAI (or vLLM) API this host does not serve yet: each is refused with
    /// a 400 naming it unless it asks for the default behaviour.
    #[serde(flatten)]
    pub unserved: Unserved,
    /// The shared generation fields.
    #[serde(flatten)]
    pub generation: GenerationFields,
}

/// Request fields not served yet (see [`ChatRequest::unserved`]).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Unserved {
    /// Token log-probabilities (`false`/null is the default).
    #[serde(default)]
    pub logprobs: Option<Value>,
    /// Top log-probabilities per token.
    #[serde(default)]
    pub top_logprobs: Option<Value>,
    /// Structured output (`{"type": "text"}` is the default).
    #[serde(default)]
    pub response_format: Option<Value>,
    /// vLLM's guided decoding.
    #[serde(default)]
    pub guided_json: Option<Value>,
    /// vLLM's guided decoding.
    #[serde(default)]
    pub guided_regex: Option<Value>,
    /// vLLM's guided decoding.
    #[serde(default)]
    pub guided_choice: Option<Value>,
    /// vLLM's guided decoding.
    #[serde(default)]
    pub guided_grammar: Option<Value>,
    /// vLLM's structured outputs.
    #[serde(default)]
    pub structured_outputs: Option<Value>,
    /// Token biases (`{}` is the default).
    #[serde(default)]
    pub logit_bias: Option<Value>,
    /// Presence penalty (0 is the default).
    #[serde(default)]
    pub presence_penalty: Option<Value>,
    /// Frequency penalty (0 is the default).
    #[serde(default)]
    pub frequency_penalty: Option<Value>,
}

impl Unserved {
    /// Refuses every field that asks for something this host does not do yet.
    pub fn check(&self) -> ApiResult<()> {
        let default = |v: &Value| match v {
            Value::Null | Value::Bool(false) => true,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::Object(o) => {
                o.is_empty() || (o.len() == 1 && o.get("type") == Some(&Value::from("text")))
            }
            _ => false,
        };
        let fields: [(&'static str, &Option<Value>, &str); 11] = [
            (
                "logprobs",
                &self.logprobs,
                "log-probabilities are not served yet",
            ),
            (
                "top_logprobs",
                &self.top_logprobs,
                "log-probabilities are not served yet",
            ),
            (
                "response_format",
                &self.response_format,
                "only {\"type\": \"text\"} is served; constrained output is not served yet",
            ),
            (
                "guided_json",
                &self.guided_json,
                "guided decoding is not served yet",
            ),
            (
                "guided_regex",
                &self.guided_regex,
                "guided decoding is not served yet",
            ),
            (
                "guided_choice",
                &self.guided_choice,
                "guided decoding is not served yet",
            ),
            (
                "guided_grammar",
                &self.guided_grammar,
                "guided decoding is not served yet",
            ),
            (
                "structured_outputs",
                &self.structured_outputs,
                "structured outputs are not served yet",
            ),
            (
                "logit_bias",
                &self.logit_bias,
                "logit biases are not served",
            ),
            (
                "presence_penalty",
                &self.presence_penalty,
                "penalties are not served; send 0 or leave it out",
            ),
            (
                "frequency_penalty",
                &self.frequency_penalty,
                "penalties are not served; send 0 or leave it out",
            ),
        ];
        for (param, v, why) in fields {
            if let Some(v) = v
                && !default(v)
            {
                return Err(ApiError::field(param, format!("`{param}` {v}: {why}")));
            }
        }
        Ok(())
    }
}

/// A chat request after validation: everything but the messages (converted off the
/// executor by [`convert_messages`]).
#[derive(Debug, Clone)]
pub struct ChatParams {
    /// Model key.
    pub key: String,
    /// The shared generation fields.
    pub generation: Generation,
    /// Stream SSE chunks.
    pub stream: bool,
    /// Send a last chunk with usage (streaming only).
    pub include_usage: bool,
    /// The tools the model may call (none with `tool_choice: "none"`).
    pub tools: Vec<ToolDefinition>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// Generate at least this many tokens.
    pub min_tokens: usize,
}

impl ChatRequest {
    /// Checks every field but the messages, the same way for every model (the demo
    /// included); the error names the field. `max_tokens_cap` bounds `max_tokens` and
    /// `min_tokens`.
    pub fn validate(&self, max_tokens_cap: usize) -> ApiResult<ChatParams> {
        let key = model_key(self.model.as_ref())?;
        let generation = self.generation.validate(max_tokens_cap)?;
        match present(&self.n) {
            None => {}
            Some(v) if v.as_u64() == Some(1) => {}
            Some(v) => {
                return Err(ApiError::field(
                    "n",
                    format!("`n` must be 1 (one choice per request), got {v}"),
                ));
            }
        }
        self.unserved.check()?;
        let stream = flag("stream", self.stream.as_ref())?;
        let include_usage = match present(&self.stream_options) {
            None => false,
            Some(_) if !stream => {
                return Err(ApiError::field(
                    "stream_options",
                    "`stream_options` is only allowed with `stream: true`",
                ));
            }
            Some(Value::Object(o)) => {
                if let Some(k) = o.keys().find(|k| *k != "include_usage") {
                    return Err(ApiError::field(
                        "stream_options",
                        format!("`stream_options.{k}` is not served; only `include_usage`"),
                    ));
                }
                match o.get("include_usage") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(other) => {
                        return Err(ApiError::field(
                            "stream_options",
                            format!(
                                "`stream_options.include_usage` must be true or false, got {other}"
                            ),
                        ));
                    }
                }
            }
            Some(other) => {
                return Err(ApiError::field(
                    "stream_options",
                    format!("`stream_options` must be an object, got {other}"),
                ));
            }
        };
        let mut tools = parse_tools(self.tools.as_ref())?;
        match self.tool_choice.as_ref() {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "auto" => {}
            Some(Value::String(s)) if s == "none" => tools.clear(),
            Some(other) => {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("`tool_choice` {other} is not supported; use \"auto\" or \"none\""),
                ));
            }
        }
        let stop = parse_stop(self.stop.as_ref())?;
        let ignore_eos = flag("ignore_eos", self.ignore_eos.as_ref())?;
        let min_tokens = match present(&self.min_tokens) {
            None => 0,
            Some(v) => v
                .as_u64()
                .filter(|&n| n as usize <= max_tokens_cap)
                .ok_or_else(|| {
                    ApiError::field(
                        "min_tokens",
                        format!(
                            "`min_tokens` must be an integer between 0 and max_tokens, got {v}"
                        ),
                    )
                })? as usize,
        };
        if let Some(max) = generation.max_tokens
            && min_tokens > max
        {
            return Err(ApiError::field(
                "min_tokens",
                format!("`min_tokens` ({min_tokens}) is over `max_tokens` ({max})"),
            ));
        }
        Ok(ChatParams {
            key,
            generation,
            stream,
            include_usage,
            tools,
            stop,
            ignore_eos,
            min_tokens,
        })
    }
}

/// `POST /v1/episodes`.
#[derive(Debug, Clone, Deserialize)]
pub struct EpisodeRequest {
    /// Model key (required; a string).
    #[serde(default)]
    pub model: Option<Value>,
    /// System prompt (a string).
    #[serde(default)]
    pub system_prompt: Option<Value>,
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

/// The model key of a request: a non-empty string.
pub fn model_key(model: Option<&Value>) -> ApiResult<String> {
    match model {
        None | Some(Value::Null) => Err(ApiError::field("model", "`model` is required")),
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(other) => Err(ApiError::field(
            "model",
            format!("`model` must be a model key (a non-empty string), got {other}"),
        )),
    }
}

/// An optional string field (absent or null: `None`).
pub fn string_field(param: &'static str, v: Option<&Value>) -> ApiResult<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::field(
            param,
            format!("`{param}` must be a string, got {other}"),
        )),
    }
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
