//! The episodes API as typed: [`EpisodeRequest`] and [`ActRequest`], and the messages of a
//! chat request converted to template messages ([`convert_messages`]).

use serde::Deserialize;
use serde_json::Value;

use super::fields::GenerationFields;
use crate::policy::format::Message;
use crate::server::error::{ApiError, ApiResult};

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
    /// OpenAI's `tool_choice` for every act (constrains the answers; see chat completions).
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// OpenAI's `response_format` for every act.
    #[serde(default)]
    pub response_format: Option<Value>,
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
