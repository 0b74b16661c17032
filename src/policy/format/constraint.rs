//! What a constrained answer may be, as a grammar: the tool-call syntax the model was trained
//! on (`<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`, several calls one per line,
//! JSON as Python's `json.dumps` writes it, `name` before `arguments`) with each call's
//! arguments valid against its tool's JSON schema (an object's properties in the order the
//! schema lists them, as llguidance writes objects), free text, JSON answers, and Qwen3's
//! optional `<think>` block first when thinking is on.
//!
//! The grammars are in llguidance's Lark dialect (see [`crate::grammar`]); `<tool_call>`,
//! `<think>` and the other added tokens are named as tokens, so free text can never spell them
//! and a call is always the tokens the model was trained to write. The parser
//! ([`parse_output`](super::parse_output)) stays the one place that reads the output.

use serde_json::{Value, json};

use super::tools::ToolDefinition;
use crate::error::{Error, Result};
use crate::grammar::{Grammar, GrammarCompiler};

/// Which tool calls an answer may or must make (OpenAI's `tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Free text, or valid calls (after optional text).
    Auto,
    /// One or more valid calls, nothing else.
    Required,
    /// Exactly this function, once.
    Function(String),
    /// No call: free text only.
    None,
}

/// What a plain (call-free) answer must be (OpenAI's `response_format`).
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// Any JSON object.
    JsonObject,
    /// JSON valid against this schema.
    JsonSchema(Value),
}

/// A constraint on what a model answers: its tool calls and the form of its text.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputConstraint {
    /// Which calls are allowed or required.
    pub tool_choice: ToolChoice,
    /// The form of a call-free answer (`None`: free text).
    pub response_format: Option<ResponseFormat>,
}

impl OutputConstraint {
    /// Calls per `choice`; text as the model likes.
    pub fn tools(choice: ToolChoice) -> Self {
        Self {
            tool_choice: choice,
            response_format: None,
        }
    }

    /// A call-free answer in `format`.
    pub fn json(format: ResponseFormat) -> Self {
        Self {
            tool_choice: ToolChoice::None,
            response_format: Some(format),
        }
    }

    /// The grammar of this constraint over `tools` (Lark source), with an optional think
    /// block first when `thinking`. Errors: a named function that is not a tool, calls
    /// required without tools.
    pub fn grammar(&self, tools: &[ToolDefinition], thinking: bool) -> Result<String> {
        let body = match &self.tool_choice {
            ToolChoice::Required | ToolChoice::Function(_) if tools.is_empty() => {
                return Err(Error::Grammar(format!(
                    "tool_choice {} needs tools, and the request has none",
                    self.choice_name()
                )));
            }
            ToolChoice::Function(name) => {
                let tool = tools.iter().find(|t| t.name() == name).ok_or_else(|| {
                    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
                    Error::Grammar(format!(
                        "tool_choice names function `{name}`, which is not among the request's tools ({})",
                        names.join(", ")
                    ))
                })?;
                format!("body: call\n{}", call_rule(std::slice::from_ref(tool)))
            }
            ToolChoice::Required => format!("body: calls\n{}", calls_rules(tools)),
            ToolChoice::Auto if !tools.is_empty() => format!(
                "body: answer | TEXT? calls\n{}\n{}",
                self.answer_rule(),
                calls_rules(tools)
            ),
            ToolChoice::Auto | ToolChoice::None => format!("body: answer\n{}", self.answer_rule()),
        };
        let start = if thinking {
            format!(
                "start: think? body\nthink: <think> THINK? </think> BREAK?\nTHINK: {FREE}\nBREAK: /[ \\t\\r\\n]+/\n"
            )
        } else {
            "start: body\n".to_string()
        };
        Ok(format!("%llguidance {{}}\n{start}{body}\nTEXT: {FREE}\n"))
    }

    fn choice_name(&self) -> String {
        match &self.tool_choice {
            ToolChoice::Auto => "\"auto\"".into(),
            ToolChoice::Required => "\"required\"".into(),
            ToolChoice::None => "\"none\"".into(),
            ToolChoice::Function(n) => format!("function `{n}`"),
        }
    }

    /// The rule of a call-free answer.
    fn answer_rule(&self) -> String {
        match &self.response_format {
            None => "answer: TEXT".into(),
            Some(ResponseFormat::JsonObject) => {
                format!("answer: %json {}", compact(json!({"type": "object"})))
            }
            Some(ResponseFormat::JsonSchema(schema)) => {
                format!("answer: %json {}", compact(schema.clone()))
            }
        }
    }

    /// Compiles this constraint's grammar. A schema the grammar engine refuses is an error
    /// naming the tool (or the response format) and what was refused.
    pub fn compile(
        &self,
        compiler: &GrammarCompiler,
        tools: &[ToolDefinition],
        thinking: bool,
    ) -> Result<Grammar> {
        let source = self.grammar(tools, thinking)?;
        compiler.compile(&source).map_err(|e| {
            // Which part is refused: each tool's schema alone, then the response format's.
            let uses_tools = !matches!(self.tool_choice, ToolChoice::None);
            for tool in tools.iter().filter(|_| uses_tools) {
                let one = format!(
                    "%llguidance {{}}\nstart: call\n{}",
                    call_rule(std::slice::from_ref(tool))
                );
                if let Err(Error::Grammar(why)) = compiler.compile(&one) {
                    return Error::Grammar(format!("tool `{}`: {why}", tool.name()));
                }
            }
            if self.response_format.is_some() {
                let one = format!(
                    "%llguidance {{}}\nstart: answer\n{}\nTEXT: {FREE}\n",
                    self.answer_rule()
                );
                if let Err(Error::Grammar(why)) = compiler.compile(&one) {
                    return Error::Grammar(format!("response_format: {why}"));
                }
            }
            e
        })
    }
}

/// Free text: anything but the added tokens (which the grammar names where they belong), and
/// never the tags spelled out of pieces (the parser would read them as tags).
const FREE: &str = r"/(?s:.+)/ & ~/(?s:.*)<\/?(tool_call|think)>(?s:.*)/";

/// Several calls, one per line.
fn calls_rules(tools: &[ToolDefinition]) -> String {
    format!("calls: call (\"\\n\" call)*\n{}", call_rule(tools))
}

/// One call of one of `tools`.
fn call_rule(tools: &[ToolDefinition]) -> String {
    let options: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": t.name()},
                    "arguments": t.function.parameters,
                },
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = if options.len() == 1 {
        options.into_iter().next().unwrap_or_default()
    } else {
        json!({ "anyOf": options })
    };
    format!(
        "call: <tool_call> \"\\n\" %json {} \"\\n\" </tool_call>",
        compact(schema)
    )
}

/// `schema` with llguidance's formatting options: JSON as `json.dumps` writes it (what the
/// chat template renders calls with, so what the model was trained on), no free whitespace.
fn compact(mut schema: Value) -> String {
    if let Value::Object(map) = &mut schema {
        map.insert(
            "x-guidance".into(),
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            }),
        );
    }
    schema.to_string()
}
