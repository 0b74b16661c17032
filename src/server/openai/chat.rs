//! `POST /v1/chat/completions` as typed: [`ChatRequest`], the fields not served yet
//! ([`Unserved`]), and [`ChatRequest::validate`] into [`ChatParams`].

use serde::Deserialize;
use serde_json::Value;

use super::fields::{
    Generation, GenerationFields, flag, min_tokens, model_key, parse_stop, parse_tools, present,
};
use crate::policy::format::ToolDefinition;
use crate::server::error::{ApiError, ApiResult};

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// Model key (required; a string).
    #[serde(default)]
    pub model: Option<Value>,
    /// OpenAI messages (converted by [`convert_messages`](super::convert_messages)).
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
        let min_tokens = min_tokens(
            present(&self.min_tokens),
            max_tokens_cap,
            generation.max_tokens,
        )?;
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
/// executor by [`convert_messages`](super::convert_messages)).
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
