//! OpenAI's `tool_choice` and `response_format` as an [`OutputConstraint`]: a request with
//! `tool_choice` `auto`, `required` or a named function, or with a JSON `response_format`, is
//! constrained (its answers follow a grammar, see `crate::grammar`); one with neither, or with
//! only `tool_choice: "none"` (vLLM's meaning: not parsed), is not.

use serde_json::Value;

use crate::policy::format::{OutputConstraint, ResponseFormat, ToolChoice};
use crate::server::error::{ApiError, ApiResult};

/// The constraint of a request's `tool_choice` and `response_format` (`None`: neither asks for
/// one), and whether its answer is parsed into tool calls (not with `tool_choice: "none"`).
pub fn output_constraint(
    tool_choice: Option<&Value>,
    response_format: Option<&Value>,
) -> ApiResult<(Option<OutputConstraint>, bool)> {
    let choice = match tool_choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "none" => ToolChoice::None,
            other => {
                return Err(ApiError::field(
                    "tool_choice",
                    format!(
                        "`tool_choice` \"{other}\": use \"auto\", \"required\", \"none\" or {{\"type\": \"function\", \"function\": {{\"name\": ..}}}}"
                    ),
                ));
            }
        }),
        Some(v @ Value::Object(_)) => {
            let name = v
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|_| v.get("type").is_none_or(|t| t == "function"));
            match name {
                Some(n) => Some(ToolChoice::Function(n.to_string())),
                None => {
                    return Err(ApiError::field(
                        "tool_choice",
                        format!(
                            "`tool_choice` {v}: name a function as {{\"type\": \"function\", \"function\": {{\"name\": ..}}}}"
                        ),
                    ));
                }
            }
        }
        Some(other) => {
            return Err(ApiError::field(
                "tool_choice",
                format!("`tool_choice` must be a string or an object, got {other}"),
            ));
        }
    };
    let format = match response_format {
        None | Some(Value::Null) => None,
        Some(v) => match v.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(ResponseFormat::JsonObject),
            Some("json_schema") => match v.pointer("/json_schema/schema") {
                Some(schema @ (Value::Object(_) | Value::Bool(true))) => {
                    Some(ResponseFormat::JsonSchema(schema.clone()))
                }
                _ => {
                    return Err(ApiError::field(
                        "response_format",
                        "`response_format` json_schema needs `json_schema.schema`, a JSON-schema object",
                    ));
                }
            },
            _ => {
                return Err(ApiError::field(
                    "response_format",
                    format!(
                        "`response_format` {v}: use {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or {{\"type\": \"json_schema\", \"json_schema\": {{\"schema\": ..}}}}"
                    ),
                ));
            }
        },
    };
    let parse_calls = choice != Some(ToolChoice::None);
    let constraint = match (choice, format) {
        // `none` alone is vLLM's: the tools stay in the prompt and the answer is not parsed,
        // unconstrained (what RL trainers send; a constrained row would cost their steps
        // pipelining).
        (None | Some(ToolChoice::None), None) => None,
        (choice, response_format) => Some(OutputConstraint {
            // A response format alone constrains the text, and calls stay allowed as usual.
            tool_choice: choice.unwrap_or(ToolChoice::Auto),
            response_format,
        }),
    };
    Ok((constraint, parse_calls))
}
