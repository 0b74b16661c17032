//! Chat messages as HF chat templates take them (`role`, `content`, `tool_calls`, ...).

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// One chat message. Serializes to exactly the dict HF's `apply_chat_template` receives:
/// absent optional fields are left out, so `message.tool_calls` is undefined in the template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text; `null` in the input is read as the empty string.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: String,
    /// Separate reasoning text of an assistant turn (rendered inside `<think>` by Qwen3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls made by an assistant turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// The id of the call a `tool` message answers (not rendered by Qwen3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Optional name (some templates render it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

impl Message {
    fn plain(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.to_string(),
            content: content.into(),
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::plain("system", content)
    }
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::plain("user", content)
    }
    /// An assistant message without tool calls.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::plain("assistant", content)
    }
    /// An assistant message with tool calls (`content` is the text around them, often empty).
    pub fn assistant_with_calls(content: impl Into<String>, calls: Vec<MessageToolCall>) -> Self {
        let mut m = Self::plain("assistant", content);
        m.tool_calls = Some(calls);
        m
    }
    /// A tool result.
    pub fn tool(content: impl Into<String>) -> Self {
        Self::plain("tool", content)
    }
}

/// A tool call inside an assistant message: `{"type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageToolCall {
    /// Optional call id (OpenAI); not rendered by Qwen3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `"function"`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// Name and arguments.
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".to_string()
}

/// Name and arguments of a call. `arguments` is an object, or a JSON-encoded string (as
/// OpenAI sends it); the template renders the string verbatim and the object with `tojson`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Tool name.
    pub name: String,
    /// Arguments: an object or a JSON string.
    pub arguments: Value,
}

impl MessageToolCall {
    /// A call with object arguments.
    pub fn new(name: impl Into<String>, arguments: serde_json::Map<String, Value>) -> Self {
        Self {
            id: None,
            kind: function_type(),
            function: FunctionCall {
                name: name.into(),
                arguments: Value::Object(arguments),
            },
        }
    }
}
