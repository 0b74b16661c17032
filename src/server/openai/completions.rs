//! `POST /v1/completions` as typed: [`CompletionRequest`] and its one validation path into
//! [`CompletionParams`]. vLLM's OpenAI server is the reference for each field: `prompt` as
//! text, a list of texts, a list of token ids or a list of token-id lists; `n` samples per
//! prompt; `top_k` 0 or -1 for off; `return_token_ids` for the prompt's and each choice's
//! token ids (what RL trainers read); `max_tokens` 16 when absent.

use serde::Deserialize;
use serde_json::Value;

use super::chat::Unserved;
use super::fields::{
    Generation, GenerationFields, SamplingExtras, flag, logprob_count, min_tokens, model_key,
    parse_stop, present, samples, sampling_extras,
};
use crate::server::error::{ApiError, ApiResult};

/// `max_tokens` of a completion that gives none (OpenAI's and vLLM's default).
pub const DEFAULT_COMPLETION_TOKENS: usize = 16;

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// Model key (required; a string).
    #[serde(default)]
    pub model: Option<Value>,
    /// A text, a list of texts, a list of token ids or a list of token-id lists.
    #[serde(default)]
    pub prompt: Value,
    /// Samples per prompt.
    #[serde(default)]
    pub n: Option<Value>,
    /// vLLM's top-k (0 or -1: off).
    #[serde(default)]
    pub top_k: Option<Value>,
    /// vLLM's min-p (0: off).
    #[serde(default)]
    pub min_p: Option<Value>,
    /// vLLM's repetition penalty (1: off; other values are not served yet).
    #[serde(default)]
    pub repetition_penalty: Option<Value>,
    /// Log-probabilities: of each generated token and of the `k` most likely tokens at its
    /// position (0: the generated token's only; at most 20).
    #[serde(default)]
    pub logprobs: Option<Value>,
    /// Stop strings: a string or a list.
    #[serde(default)]
    pub stop: Option<Value>,
    /// Stream SSE chunks (not served on this route yet).
    #[serde(default)]
    pub stream: Option<Value>,
    /// Echo the prompt into the text (not served).
    #[serde(default)]
    pub echo: Option<Value>,
    /// Text after the completion (not served).
    #[serde(default)]
    pub suffix: Option<Value>,
    /// OpenAI's best-of (only equal to `n`, or absent).
    #[serde(default)]
    pub best_of: Option<Value>,
    /// vLLM's extension: keep generating past EOS.
    #[serde(default)]
    pub ignore_eos: Option<Value>,
    /// vLLM's extension: generate at least this many tokens.
    #[serde(default)]
    pub min_tokens: Option<Value>,
    /// vLLM's extension: each choice carries `token_ids` and `prompt_token_ids`.
    #[serde(default)]
    pub return_token_ids: Option<Value>,
    /// vLLM's extension: the tokens of `logprobs` as `token_id:N` instead of their text.
    #[serde(default)]
    pub return_tokens_as_token_ids: Option<Value>,
    /// Fields of the OpenAI (or vLLM) API this host does not serve yet.
    #[serde(flatten)]
    pub unserved: Unserved,
    /// The shared generation fields.
    #[serde(flatten)]
    pub generation: GenerationFields,
}

/// The prompts of a completion request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompts {
    /// Texts, tokenized by the model's tokenizer.
    Text(Vec<String>),
    /// Token ids, as sent.
    Ids(Vec<Vec<u32>>),
}

impl Prompts {
    /// How many prompts.
    pub fn len(&self) -> usize {
        match self {
            Self::Text(t) => t.len(),
            Self::Ids(i) => i.len(),
        }
    }

    /// Whether there are none (never after validation).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A completion request after validation.
#[derive(Debug, Clone)]
pub struct CompletionParams {
    /// Model key.
    pub key: String,
    /// The prompts (at least one).
    pub prompts: Prompts,
    /// Samples per prompt (at least 1).
    pub n: usize,
    /// The shared generation fields (`max_tokens` filled with the route's default).
    pub generation: Generation,
    /// top-k, min-p, repetition penalty.
    pub extras: SamplingExtras,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// Generate at least this many tokens.
    pub min_tokens: usize,
    /// Return the prompt's and each choice's token ids.
    pub return_token_ids: bool,
    /// Log-probabilities with this many alternatives per token (`None`: none).
    pub logprobs: Option<usize>,
    /// Name the tokens of `logprobs` `token_id:N`.
    pub tokens_as_ids: bool,
}

/// One prompt's token id: a non-negative integer below 2^32.
fn token_id(v: &Value, at: &str) -> ApiResult<u32> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            ApiError::field(
                "prompt",
                format!("`prompt{at}` must hold token ids (non-negative integers), got {v}"),
            )
        })
}

/// `prompt` as sent: a text, texts, token ids or token-id lists (none empty).
pub fn parse_prompts(v: &Value) -> ApiResult<Prompts> {
    let empty = || ApiError::field("prompt", "`prompt` must not be empty");
    match v {
        Value::String(s) if !s.is_empty() => Ok(Prompts::Text(vec![s.clone()])),
        Value::Array(items) if !items.is_empty() => match &items[0] {
            Value::String(_) => items
                .iter()
                .enumerate()
                .map(|(i, p)| match p {
                    Value::String(s) if !s.is_empty() => Ok(s.clone()),
                    Value::String(_) => Err(empty()),
                    other => Err(ApiError::field(
                        "prompt",
                        format!("`prompt[{i}]` must be a text like the first, got {other}"),
                    )),
                })
                .collect::<ApiResult<_>>()
                .map(Prompts::Text),
            Value::Array(_) => items
                .iter()
                .enumerate()
                .map(|(i, p)| match p {
                    Value::Array(ids) if !ids.is_empty() => ids
                        .iter()
                        .enumerate()
                        .map(|(j, t)| token_id(t, &format!("[{i}][{j}]")))
                        .collect::<ApiResult<Vec<u32>>>(),
                    Value::Array(_) => Err(empty()),
                    other => Err(ApiError::field(
                        "prompt",
                        format!(
                            "`prompt[{i}]` must be a token-id list like the first, got {other}"
                        ),
                    )),
                })
                .collect::<ApiResult<_>>()
                .map(Prompts::Ids),
            _ => items
                .iter()
                .enumerate()
                .map(|(i, t)| token_id(t, &format!("[{i}]")))
                .collect::<ApiResult<Vec<u32>>>()
                .map(|ids| Prompts::Ids(vec![ids])),
        },
        Value::String(_) | Value::Array(_) => Err(empty()),
        Value::Null => Err(ApiError::field("prompt", "`prompt` is required")),
        other => Err(ApiError::field(
            "prompt",
            format!("`prompt` must be a text, a list of texts or token ids, got {other}"),
        )),
    }
}

impl CompletionRequest {
    /// Checks every field; the error names the field. `max_tokens_cap` bounds `max_tokens`
    /// and `min_tokens`; `max_choices` bounds prompts x `n`.
    pub fn validate(
        &self,
        max_tokens_cap: usize,
        max_choices: usize,
    ) -> ApiResult<CompletionParams> {
        let key = model_key(self.model.as_ref())?;
        let mut generation = self.generation.validate(max_tokens_cap)?;
        generation.max_tokens = Some(
            generation
                .max_tokens
                .unwrap_or(DEFAULT_COMPLETION_TOKENS.min(max_tokens_cap)),
        );
        let prompts = parse_prompts(&self.prompt)?;
        let n = samples(present(&self.n), prompts.len(), max_choices)?;
        match present(&self.best_of) {
            None => {}
            Some(v) if v.as_u64() == Some(n as u64) => {}
            Some(v) => {
                return Err(ApiError::field(
                    "best_of",
                    format!("`best_of` {v} is not served; leave it out or equal to `n`"),
                ));
            }
        }
        let extras = sampling_extras(
            present(&self.top_k),
            present(&self.min_p),
            present(&self.repetition_penalty),
        )?;
        let logprobs = present(&self.logprobs)
            .map(|v| logprob_count("logprobs", v))
            .transpose()?;
        if flag("stream", self.stream.as_ref())? {
            return Err(ApiError::field(
                "stream",
                "streaming is not served on /v1/completions yet; /v1/chat/completions streams",
            ));
        }
        if flag("echo", self.echo.as_ref())? {
            return Err(ApiError::field("echo", "`echo` is not served"));
        }
        if present(&self.suffix).is_some_and(|s| s.as_str() != Some("")) {
            return Err(ApiError::field("suffix", "`suffix` is not served"));
        }
        self.unserved.check(false)?;
        let tokens_as_ids = flag(
            "return_tokens_as_token_ids",
            self.return_tokens_as_token_ids.as_ref(),
        )?;
        let min_tokens = min_tokens(
            present(&self.min_tokens),
            max_tokens_cap,
            generation.max_tokens,
        )?;
        Ok(CompletionParams {
            key,
            prompts,
            n,
            generation,
            extras,
            stop: parse_stop(self.stop.as_ref())?,
            ignore_eos: flag("ignore_eos", self.ignore_eos.as_ref())?,
            min_tokens,
            return_token_ids: flag("return_token_ids", self.return_token_ids.as_ref())?,
            logprobs,
            tokens_as_ids,
        })
    }
}
