//! `POST /v1/chat/completions` as typed: [`ChatRequest`], the fields not served yet
//! ([`Unserved`]), and [`ChatRequest::validate`] into [`ChatParams`].

use serde::Deserialize;
use serde_json::Value;

use super::fields::{
    Generation, GenerationFields, SamplingExtras, flag, logprob_count, min_tokens, model_key,
    parse_stop, parse_tools, present, samples, sampling_extras,
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
    /// Number of choices (samples of the conversation; 1 when streaming).
    #[serde(default)]
    pub n: Option<Value>,
    /// Log-probabilities of the generated tokens (`true`), with `top_logprobs` alternatives.
    #[serde(default)]
    pub logprobs: Option<Value>,
    /// Alternatives per token with `logprobs` (0..=20).
    #[serde(default)]
    pub top_logprobs: Option<Value>,
    /// vLLM's top-k (0 or -1: off).
    #[serde(default)]
    pub top_k: Option<Value>,
    /// vLLM's min-p (0: off).
    #[serde(default)]
    pub min_p: Option<Value>,
    /// vLLM's repetition penalty (1: off; other values are not served yet).
    #[serde(default)]
    pub repetition_penalty: Option<Value>,
    /// vLLM's extension: the prompt's token ids (top level) and each choice's.
    #[serde(default)]
    pub return_token_ids: Option<Value>,
    /// vLLM's extension: the tokens of `logprobs` as `token_id:N` instead of their text.
    #[serde(default)]
    pub return_tokens_as_token_ids: Option<Value>,
    /// Arguments of the chat template: `{"enable_thinking": bool}`.
    #[serde(default)]
    pub chat_template_kwargs: Option<Value>,
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
        let n = samples(present(&self.n), 1, MAX_CHOICES)?;
        self.unserved.check(true)?;
        let stream = flag("stream", self.stream.as_ref())?;
        if stream && n > 1 {
            return Err(ApiError::field(
                "n",
                format!("`n` {n} with `stream: true` is not served yet; stream one choice"),
            ));
        }
        let extras = sampling_extras(
            present(&self.top_k),
            present(&self.min_p),
            present(&self.repetition_penalty),
        )?;
        let logprobs = match (
            flag("logprobs", self.logprobs.as_ref())?,
            present(&self.top_logprobs),
        ) {
            (true, k) => Some(
                k.map(|k| logprob_count("top_logprobs", k))
                    .transpose()?
                    .unwrap_or(0),
            ),
            (false, None) => None,
            (false, Some(_)) => {
                return Err(ApiError::field(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                ));
            }
        };
        if stream && logprobs.is_some() {
            return Err(ApiError::field(
                "logprobs",
                "log-probabilities are not streamed yet; send `stream: false`",
            ));
        }
        let enable_thinking = match present(&self.chat_template_kwargs) {
            None => None,
            Some(Value::Object(o)) => {
                if let Some(k) = o.keys().find(|k| *k != "enable_thinking") {
                    return Err(ApiError::field(
                        "chat_template_kwargs",
                        format!("`chat_template_kwargs.{k}` is not served; only `enable_thinking`"),
                    ));
                }
                match o.get("enable_thinking") {
                    None | Some(Value::Null) => None,
                    Some(Value::Bool(b)) => Some(*b),
                    Some(other) => {
                        return Err(ApiError::field(
                            "chat_template_kwargs",
                            format!(
                                "`chat_template_kwargs.enable_thinking` must be true or false, got {other}"
                            ),
                        ));
                    }
                }
            }
            Some(other) => {
                return Err(ApiError::field(
                    "chat_template_kwargs",
                    format!("`chat_template_kwargs` must be an object, got {other}"),
                ));
            }
        };
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
        let tools = parse_tools(self.tools.as_ref())?;
        // With `tool_choice: "none"` the tools stay in the prompt (as vLLM renders them) and
        // the answer is not parsed into calls.
        let (constraint, parse_calls) = super::output_constraint(
            self.tool_choice.as_ref(),
            self.unserved.response_format.as_ref(),
        )?;
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
            parse_calls,
            constraint,
            stop,
            ignore_eos,
            min_tokens,
            n,
            extras,
            logprobs,
            return_token_ids: flag("return_token_ids", self.return_token_ids.as_ref())?,
            tokens_as_ids: flag(
                "return_tokens_as_token_ids",
                self.return_tokens_as_token_ids.as_ref(),
            )?,
            enable_thinking,
        })
    }
}

/// Request fields not served yet (see [`ChatRequest::unserved`]).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Unserved {
    /// Structured output (`{"type": "text"}` is the default; chat completions serve
    /// `json_object` and `json_schema`).
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
    /// Refuses every field that asks for something this host does not do yet
    /// (`response_format` only where the route does not serve it).
    pub fn check(&self, response_format_served: bool) -> ApiResult<()> {
        let default = |v: &Value| match v {
            Value::Null | Value::Bool(false) => true,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::Object(o) => {
                o.is_empty() || (o.len() == 1 && o.get("type") == Some(&Value::from("text")))
            }
            _ => false,
        };
        let fields: [(&'static str, &Option<Value>, &str); 9] = [
            (
                "response_format",
                &self.response_format,
                "only {\"type\": \"text\"} is served on this route; /v1/chat/completions serves json_object and json_schema",
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
            if param == "response_format" && response_format_served {
                continue;
            }
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
    /// The tools of the request (rendered into the prompt).
    pub tools: Vec<ToolDefinition>,
    /// Whether the answer is parsed into tool calls (not with `tool_choice: "none"`).
    pub parse_calls: bool,
    /// What `tool_choice` / `response_format` constrain the answers to (`None`: neither
    /// was given).
    pub constraint: Option<crate::policy::format::OutputConstraint>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// Generate at least this many tokens.
    pub min_tokens: usize,
    /// Choices (samples of the conversation).
    pub n: usize,
    /// top-k, min-p, repetition penalty.
    pub extras: SamplingExtras,
    /// Log-probabilities with this many alternatives per token (`None`: none).
    pub logprobs: Option<usize>,
    /// The prompt's and each choice's token ids in the answer.
    pub return_token_ids: bool,
    /// Name the tokens of `logprobs` `token_id:N`.
    pub tokens_as_ids: bool,
    /// `chat_template_kwargs.enable_thinking` (`None`: the model's default).
    pub enable_thinking: Option<bool>,
}

/// Most choices (prompts x `n`) one request may ask for.
pub const MAX_CHOICES: usize = 4096;
