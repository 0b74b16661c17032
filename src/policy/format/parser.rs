//! The tool-call parser: model output text -> calls, content, reasoning, or a readable error.
//!
//! Accepted: `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>` (arguments an object or
//! a JSON string holding one), several calls, text around calls (kept as content), an unclosed
//! trailing call at the end of the output, any whitespace around the JSON. A leading
//! `<think>..</think>` block is split off as reasoning. Never panics; anything malformed sets
//! `error` and is never guessed at.

use serde::Serialize;
use serde_json::{Map, Value};

use super::pycompat::PyJson;
use super::tools::ToolDefinition;

/// Opening tag of a tool call.
pub const TOOL_CALL_OPEN: &str = "<tool_call>";
/// Closing tag of a tool call.
pub const TOOL_CALL_CLOSE: &str = "</tool_call>";

/// One parsed tool call.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ToolCall {
    /// Tool name.
    pub name: String,
    /// Arguments object.
    pub arguments: Map<String, Value>,
}

/// The result of parsing one model output.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ParsedOutput {
    /// Calls in order of appearance (those that parsed, even when `error` is set).
    pub calls: Vec<ToolCall>,
    /// Text outside calls and outside the think block, trimmed.
    pub content: String,
    /// The `<think>` block's text, if the output had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// Why the output is not a valid action, in words; `None` when it is.
    pub error: Option<String>,
}

/// Where the `</tool_call>` closing this call's body is: after the end of the JSON object the
/// body starts with (a `</tool_call>` inside a JSON string belongs to the arguments), else the
/// first one.
fn close_tag(body: &str) -> Option<usize> {
    let lead = body.len() - body.trim_start().len();
    if let Some(end) = json_object_end(&body[lead..]) {
        return body[lead + end..]
            .find(TOOL_CALL_CLOSE)
            .map(|p| lead + end + p);
    }
    body.find(TOOL_CALL_CLOSE)
}

/// The byte length of the JSON object at the start of `s` (up to its matching `}`), tracking
/// strings and escapes; `None` when `s` does not start with `{` or the object never closes.
fn json_object_end(s: &str) -> Option<usize> {
    if !s.starts_with('{') {
        return None;
    }
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    for (i, c) in s.char_indices() {
        if in_str {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Parses model output. With `tools`, each call is also validated against them (known name,
/// required arguments, JSON types).
pub fn parse_output(raw: &str, tools: Option<&[ToolDefinition]>) -> ParsedOutput {
    let mut out = ParsedOutput::default();
    let mut rest = raw;
    if let Some(end) = raw.find("</think>") {
        let head = &raw[..end];
        let think = head
            .rfind("<think>")
            .map(|i| &head[i + "<think>".len()..])
            .unwrap_or(head);
        out.reasoning = Some(think.trim().to_string());
        rest = &raw[end + "</think>".len()..];
    } else if raw.trim_start().starts_with("<think>") {
        out.reasoning = Some(raw.trim_start()["<think>".len()..].trim().to_string());
        out.error = Some("the output ends inside an unclosed <think> block (no action was given; raise max tokens?)".into());
        return out;
    }

    let mut content = String::new();
    let mut cursor = rest;
    while let Some(open) = cursor.find(TOOL_CALL_OPEN) {
        let before = &cursor[..open];
        if before.contains(TOOL_CALL_CLOSE) {
            out.error
                .get_or_insert_with(|| "found </tool_call> without a matching <tool_call>".into());
        }
        push_text(&mut content, before);
        let body_start = &cursor[open + TOOL_CALL_OPEN.len()..];
        let (body, next) = match close_tag(body_start) {
            Some(close) => (
                &body_start[..close],
                &body_start[close + TOOL_CALL_CLOSE.len()..],
            ),
            None => (body_start, ""), // unclosed trailing call: the body runs to the end
        };
        if body.contains(TOOL_CALL_OPEN) {
            out.error.get_or_insert_with(|| {
                "a <tool_call> opens inside another one that was never closed".into()
            });
        }
        let idx = out.calls.len() + 1;
        match parse_call(body) {
            Ok(call) => out.calls.push(call),
            Err(e) => {
                out.error
                    .get_or_insert_with(|| format!("tool call {idx}: {e}"));
            }
        }
        cursor = next;
    }
    if cursor.contains(TOOL_CALL_CLOSE) {
        out.error
            .get_or_insert_with(|| "found </tool_call> without a matching <tool_call>".into());
    }
    push_text(&mut content, cursor);
    out.content = content.trim().to_string();

    if out.error.is_none()
        && let Some(tools) = tools
    {
        for call in &out.calls {
            match tools.iter().find(|t| t.name() == call.name) {
                None => {
                    let known: Vec<&str> = tools.iter().map(|t| t.name()).collect();
                    out.error = Some(format!(
                        "unknown tool `{}`; the tools are: {}",
                        call.name,
                        known.join(", ")
                    ));
                    break;
                }
                Some(tool) => {
                    if let Err(e) = tool.validate_arguments(&call.arguments) {
                        out.error = Some(e);
                        break;
                    }
                }
            }
        }
    }
    out
}

fn push_text(content: &mut String, text: &str) {
    let t = text.trim();
    if t.is_empty() {
        return;
    }
    if !content.is_empty() {
        content.push('\n');
    }
    content.push_str(t);
}

fn parse_call(body: &str) -> Result<ToolCall, String> {
    let body = body.trim();
    if body.is_empty() {
        return Err("empty <tool_call> block".into());
    }
    let value: Value = serde_json::from_str(body)
        .map_err(|e| format!("not valid JSON ({e}): {}", preview(body)))?;
    let Value::Object(mut obj) = value else {
        return Err(format!(
            "expected a JSON object with \"name\" and \"arguments\", got {}",
            preview(body)
        ));
    };
    let name = match obj.remove("name") {
        Some(Value::String(n)) if !n.trim().is_empty() => n,
        Some(Value::String(_)) => return Err("\"name\" is empty".into()),
        Some(other) => return Err(format!("\"name\" must be a string, got {other}")),
        None => return Err("missing \"name\"".into()),
    };
    let arguments = match obj.remove("arguments") {
        Some(Value::Object(a)) => a,
        Some(Value::String(s)) => match serde_json::from_str::<Value>(&s) {
            Ok(Value::Object(a)) => a,
            Ok(other) => {
                return Err(format!(
                    "\"arguments\" of `{name}` is a string that holds {other}, not an object"
                ));
            }
            Err(e) => {
                return Err(format!(
                    "\"arguments\" of `{name}` is a string that is not JSON ({e})"
                ));
            }
        },
        Some(Value::Null) | None => {
            return Err(format!("call to `{name}` has no \"arguments\" object"));
        }
        Some(other) => {
            return Err(format!(
                "\"arguments\" of `{name}` must be an object, got {other}"
            ));
        }
    };
    Ok(ToolCall { name, arguments })
}

fn preview(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

/// Writes calls the way Qwen3's template renders an assistant's tool calls:
/// `<tool_call>\n{"name": "..", "arguments": {..}}\n</tool_call>`, joined by newlines.
pub fn format_tool_calls(calls: &[ToolCall]) -> String {
    let mut out = String::new();
    for (i, call) in calls.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str("<tool_call>\n{\"name\": \"");
        out.push_str(&call.name);
        out.push_str("\", \"arguments\": ");
        PyJson::compact().write(&Value::Object(call.arguments.clone()), 0, &mut out);
        out.push_str("}\n</tool_call>");
    }
    out
}
