//! The format: the single source of truth for every formatting decision.
//!
//! System prompt, tool definitions (OpenAI/TRL function schema), chat-template rendering and
//! the tool-call parser live here and nowhere else. Policies, the CLI, the HTTP example and the
//! tests all go through this module, so what the engine sees is byte-identical to what HF
//! `transformers` renders for the same conversation.

mod constraint;
mod messages;
mod parser;
mod pycompat;
mod template;
mod tools;

pub use constraint::{OutputConstraint, ResponseFormat, ToolChoice};
pub use messages::{FunctionCall, Message, MessageToolCall};
pub use parser::{
    ParsedOutput, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCall, format_tool_calls, parse_output,
};
pub(crate) use template::special_tokens as special_tokens_of;
pub use template::{ChatTemplate, RenderOptions};
pub use tools::{FunctionDefinition, ToolDefinition, example_arguments};

impl ToolCall {
    /// The same call as an assistant message's `tool_calls` entry (object arguments).
    pub fn to_message_call(&self) -> MessageToolCall {
        MessageToolCall::new(self.name.clone(), self.arguments.clone())
    }
}
