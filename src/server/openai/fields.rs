//! The fields every request shares and their checks: [`GenerationFields`] (max_tokens,
//! temperature, top_p, seed) and the small typed readers (`model`, strings, tools, stop
//! strings, booleans), each naming its field in the error.

use serde::Deserialize;
use serde_json::Value;

use crate::engine::{GenerationConfig, SamplingParams};
use crate::policy::format::ToolDefinition;
use crate::server::error::{ApiError, ApiResult};

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

pub(super) fn present(v: &Option<Value>) -> Option<&Value> {
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

/// vLLM's `min_tokens` (absent: 0): at most `max_tokens_cap` and, when given, `max_tokens`.
pub fn min_tokens(
    v: Option<&Value>,
    max_tokens_cap: usize,
    max_tokens: Option<usize>,
) -> ApiResult<usize> {
    let n = match v {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .filter(|&n| n as usize <= max_tokens_cap)
            .ok_or_else(|| {
                ApiError::field(
                    "min_tokens",
                    format!("`min_tokens` must be an integer between 0 and max_tokens, got {v}"),
                )
            })? as usize,
    };
    if let Some(max) = max_tokens
        && n > max
    {
        return Err(ApiError::field(
            "min_tokens",
            format!("`min_tokens` ({n}) is over `max_tokens` ({max})"),
        ));
    }
    Ok(n)
}

/// vLLM's sampling extras of a request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SamplingExtras {
    /// `top_k`: `None` absent (the model's `generation_config.json` default applies, as
    /// vLLM applies it), `Some(None)` off (0 or -1), `Some(Some(k))`.
    pub top_k: Option<Option<usize>>,
    /// `min_p` (None: absent or 0).
    pub min_p: Option<f32>,
    /// `repetition_penalty` (None: absent or 1).
    pub repetition_penalty: Option<f32>,
}

/// vLLM's sampling extras as sent: `top_k` (0 or -1: off), `min_p` (0 to 1; 0: off) and
/// `repetition_penalty` (above 0, at most 100; 1: off).
pub fn sampling_extras(
    top_k: Option<&Value>,
    min_p: Option<&Value>,
    repetition_penalty: Option<&Value>,
) -> ApiResult<SamplingExtras> {
    let repetition_penalty = match repetition_penalty {
        None | Some(Value::Null) => None,
        Some(v) => {
            let p = number("repetition_penalty", v, 0.0, 100.0)?;
            if p <= 0.0 {
                return Err(ApiError::field(
                    "repetition_penalty",
                    format!("`repetition_penalty` must be above 0, got {v}"),
                ));
            }
            Some(p).filter(|p| *p != 1.0)
        }
    };
    let min_p = match min_p {
        None | Some(Value::Null) => None,
        Some(v) => Some(number("min_p", v, 0.0, 1.0)?).filter(|p| *p > 0.0),
    };
    let top_k = match top_k {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(0 | -1) => Some(None),
            Some(k) if k > 0 => Some(Some(k as usize)),
            _ => {
                return Err(ApiError::field(
                    "top_k",
                    format!("`top_k` must be a positive integer, or 0 or -1 for off, got {v}"),
                ));
            }
        },
    };
    Ok(SamplingExtras {
        top_k,
        min_p,
        repetition_penalty,
    })
}

/// `n`, samples per prompt (absent: 1), with at most `max_choices` choices over `prompts`.
pub fn samples(v: Option<&Value>, prompts: usize, max_choices: usize) -> ApiResult<usize> {
    let n = match v {
        None | Some(Value::Null) => 1,
        Some(v) => v.as_u64().filter(|&n| n >= 1).ok_or_else(|| {
            ApiError::field("n", format!("`n` must be a positive integer, got {v}"))
        })? as usize,
    };
    if prompts.saturating_mul(n) > max_choices {
        return Err(ApiError::field(
            "n",
            format!(
                "{prompts} prompt(s) x n {n} is over the {max_choices} choices one request may ask for"
            ),
        ));
    }
    Ok(n)
}

/// A count of log-probability alternatives (`param`: `logprobs` or `top_logprobs`), 0..=20.
pub fn logprob_count(param: &'static str, v: &Value) -> ApiResult<usize> {
    v.as_u64()
        .filter(|&k| k as usize <= crate::engine::MAX_LOGPROBS)
        .map(|k| k as usize)
        .ok_or_else(|| {
            ApiError::field(
                param,
                format!(
                    "`{param}` must be an integer from 0 to {}, got {v}",
                    crate::engine::MAX_LOGPROBS
                ),
            )
        })
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
