//! SSE for chat completions: content deltas token by token as the model generates (held back
//! from the first `<tool_call>`), then the parsed tool calls, the finish reason, usage when
//! asked for, and `[DONE]`.
//!
//! Invariant: dropping the response (the client went away) drops the pending generation,
//! which cancels it in the engine.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::completion::{Completion, to_completion, tool_calls_json, usage};
use super::state::AppState;
use crate::engine::{Engine, Pending, TokenStream};
use crate::policy::format::{TOOL_CALL_OPEN, ToolDefinition};
use crate::{Generation, GenerationRequest};

/// What every chunk of one streamed completion shares.
#[derive(Clone)]
pub(super) struct ChunkMeta {
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) key: String,
    pub(super) include_usage: bool,
}

impl ChunkMeta {
    fn chunk(&self, delta: Value, finish: Value) -> String {
        self.chunk_value(delta, finish).to_string()
    }

    fn chunk_value(&self, delta: Value, finish: Value) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.key,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]})
    }

    fn opening(&self) -> String {
        self.chunk(json!({"role": "assistant", "content": ""}), Value::Null)
    }

    /// The closing chunks of a completion: tool calls or the rest of the content, the finish
    /// reason, usage when asked for, `[DONE]`.
    fn closing(&self, c: &Completion, rest_of_content: &str) -> Vec<String> {
        let mut out = Vec::new();
        if !rest_of_content.is_empty() {
            out.push(self.chunk(json!({"content": rest_of_content}), Value::Null));
        }
        if !c.calls.is_empty() {
            out.push(self.chunk(
                json!({"tool_calls": tool_calls_json(&c.calls)}),
                Value::Null,
            ));
        }
        // The chunk with the finish reason also says which weights produced the answer.
        let mut finish = self.chunk_value(json!({}), Value::String(c.finish.into()));
        if let Some(v) = &c.weights_version {
            finish["weights_version"] = json!(v);
        }
        out.push(finish.to_string());
        if self.include_usage {
            out.push(json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.key, "choices": [], "usage": usage(c)}).to_string());
        }
        out.push("[DONE]".into());
        out
    }
}

/// An answer that is already whole (the demo), sent as one SSE stream.
pub(super) fn stream_done(meta: &ChunkMeta, c: &Completion) -> Response {
    let mut events = vec![meta.opening()];
    events.extend(meta.closing(c, &c.content));
    let sse: Vec<Result<Event, Infallible>> = events
        .into_iter()
        .map(|e| Ok(Event::default().data(e)))
        .collect();
    Sse::new(futures_util::stream::iter(sse)).into_response()
}

/// How much of the text so far may go out as content: everything before a `<tool_call>`, and
/// not a trailing piece that could still grow into one.
fn visible_content(text: &str) -> usize {
    if let Some(at) = text.find(TOOL_CALL_OPEN) {
        return text[..at].trim_end().len();
    }
    let mut keep = text.len();
    for k in (1..TOOL_CALL_OPEN.len()).rev() {
        if text.len() >= k
            && text.is_char_boundary(text.len() - k)
            && TOOL_CALL_OPEN.starts_with(&text[text.len() - k..])
        {
            keep = text.len() - k;
            break;
        }
    }
    keep
}

struct Streaming {
    st: Arc<AppState>,
    meta: ChunkMeta,
    pending: Option<Pending<Generation>>,
    stream: TokenStream,
    tools: Vec<ToolDefinition>,
    text: String,
    emitted: usize,
    queue: VecDeque<String>,
}

impl Streaming {
    /// Takes a chunk of generated text; queues the content that may go out now.
    fn take_text(&mut self, chunk: &str) {
        self.text.push_str(chunk);
        let vis = visible_content(&self.text).max(self.emitted);
        if vis > self.emitted {
            let delta = json!({"content": &self.text[self.emitted..vis]});
            self.queue.push_back(self.meta.chunk(delta, Value::Null));
            self.emitted = vis;
        }
    }

    /// The generation ended: queue the closing chunks (or the error).
    fn close(&mut self, result: crate::Result<Generation>) {
        match result {
            Ok(g) => {
                let c = to_completion(&g, &self.tools);
                self.st
                    .counters
                    .tokens(c.prompt_tokens, c.completion_tokens, c.cached_tokens);
                // With tool calls, content is the text around them (already sent up to the
                // first call); without, the whole text.
                let rest = if c.calls.is_empty() {
                    g.text.get(self.emitted..).unwrap_or("").to_string()
                } else {
                    String::new()
                };
                let closing = self.meta.closing(&c, &rest);
                self.queue.extend(closing);
            }
            Err(e) => {
                self.st
                    .counters
                    .errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.queue.push_back(
                    json!({"error": {"message": e.to_string(), "type": "server_error", "param": null, "code": "server_error"}})
                        .to_string(),
                );
                self.queue.push_back("[DONE]".into());
            }
        }
    }
}

/// Submits `request` and streams its text as SSE chunks.
pub(super) fn stream_model(
    st: Arc<AppState>,
    meta: ChunkMeta,
    engine: Engine,
    request: GenerationRequest,
    tools: Vec<ToolDefinition>,
) -> Response {
    let (pending, stream) = engine.submit_streaming(request);
    let queue = VecDeque::from([meta.opening()]);
    let state = Streaming {
        st,
        meta,
        pending: Some(pending),
        stream,
        tools,
        text: String::new(),
        emitted: 0,
        queue,
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(data) = s.queue.pop_front() {
                return Some((Ok::<_, Infallible>(Event::default().data(data)), s));
            }
            s.pending.as_ref()?;
            match s.stream.next_chunk().await {
                Some(chunk) => s.take_text(&chunk),
                None => {
                    let pending = s.pending.take().expect("checked above");
                    let result = pending.await;
                    s.close(result);
                }
            }
        }
    });
    Sse::new(events).into_response()
}
