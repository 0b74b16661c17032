//! `POST /v1/chat/completions`: a typed request becomes a prepared completion (the demo
//! answers at once; a model gets a rendered, tokenized generation request), then a JSON
//! response or an SSE stream.
//!
//! Invariant: everything checkable before generation (fields, model, template, prompt length)
//! is checked before a response starts, so a streamed request fails with the same status and
//! body as a plain one.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::openai::{
    ChatRequest, convert_messages, flag, parse, parse_stop, parse_tools, require_model,
};
use super::stream::{ChunkMeta, stream_done, stream_model};
use super::{ApiError, ApiResult, AppState, blocking};
use crate::engine::{Engine, FinishReason, GenerationRequest};
use crate::policy::format::{RenderOptions, ToolDefinition, parse_output};
use crate::policy::{Action, DemoPolicy, EpisodeConfig, Observation, Policy};
use crate::{Generation, ToolCall};

/// The OpenAI view of a finished answer.
pub(super) struct Completion {
    pub(super) content: String,
    pub(super) calls: Vec<ToolCall>,
    pub(super) finish: &'static str,
    pub(super) prompt_tokens: usize,
    pub(super) completion_tokens: usize,
    pub(super) cached_tokens: usize,
}

/// A chat request ready to run: answered already (the demo), or a generation to submit.
enum Prepared {
    Done(Completion),
    Model {
        engine: Engine,
        request: GenerationRequest,
        tools: Vec<ToolDefinition>,
    },
}

/// Turns a finished generation into the OpenAI view: tool calls when the output parses into
/// valid calls, the raw text otherwise.
pub(super) fn to_completion(g: &Generation, tools: &[ToolDefinition]) -> Completion {
    let t = (!tools.is_empty()).then_some(tools);
    let parsed = parse_output(&g.text, t);
    let (content, calls) = if parsed.error.is_none() && !parsed.calls.is_empty() {
        (parsed.content, parsed.calls)
    } else {
        (g.text.clone(), vec![])
    };
    let finish = if !calls.is_empty() {
        "tool_calls"
    } else if g.finish_reason == FinishReason::Length {
        "length"
    } else {
        "stop"
    };
    Completion {
        content,
        calls,
        finish,
        prompt_tokens: g.prompt_tokens,
        completion_tokens: g.generated_tokens,
        cached_tokens: g.cached_prompt_tokens,
    }
}

/// The demo's answer: scripted by step, the step being the number of assistant turns so far
/// (one act, whatever the conversation's length).
fn demo_answer(
    key: &str,
    messages: &[crate::policy::format::Message],
    tools: Vec<ToolDefinition>,
) -> ApiResult<Completion> {
    let step = messages.iter().filter(|m| m.role == "assistant").count();
    let last = messages
        .last()
        .map(|m| m.content.clone())
        .unwrap_or_default();
    let s = DemoPolicy::new(key, &EpisodeConfig::with_tools(tools))
        .at_step(step)
        .act(Observation::Text(last))?;
    let (content, calls) = match s.action {
        Action::Call { calls, content } => (content, calls),
        Action::Reply { content } => (content, vec![]),
        Action::Invalid { raw, .. } => (raw, vec![]),
    };
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    Ok(Completion {
        content,
        calls,
        finish,
        prompt_tokens: 0,
        completion_tokens: 0,
        cached_tokens: 0,
    })
}

async fn prepare(st: &Arc<AppState>, req: ChatRequest) -> ApiResult<Prepared> {
    let key = require_model(&req.model)?;
    let gen_fields = req.generation.validate(st.cfg.max_tokens_cap)?;
    match req.n.as_ref().filter(|v| !v.is_null()) {
        None => {}
        Some(v) if v.as_u64() == Some(1) => {}
        Some(v) => {
            return Err(ApiError::field(
                "n",
                format!("`n` must be 1 (one choice per request), got {v}"),
            ));
        }
    }
    let spec = st.check_model(&key)?;
    // Converting (and for the demo, answering) a long conversation is CPU work: off the
    // executor, like rendering and tokenizing below.
    let raw_messages = req.messages;
    let messages = tokio::task::spawn_blocking(move || convert_messages(&raw_messages))
        .await
        .map_err(|_| ApiError::internal("an internal task failed"))??;
    let mut tools = parse_tools(req.tools.as_ref())?;
    match req.tool_choice.as_ref() {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "auto" => {}
        Some(Value::String(s)) if s == "none" => tools.clear(),
        Some(other) => {
            return Err(ApiError::field(
                "tool_choice",
                format!("`tool_choice` {other} is not supported; use \"auto\" or \"none\""),
            ));
        }
    }
    let stop = parse_stop(req.stop.as_ref())?;
    let ignore_eos = flag("ignore_eos", req.ignore_eos.as_ref())?;
    let min_tokens = match req.min_tokens.as_ref().filter(|v| !v.is_null()) {
        None => 0,
        Some(v) => v
            .as_u64()
            .filter(|&n| n as usize <= st.cfg.max_tokens_cap)
            .ok_or_else(|| {
                ApiError::field(
                    "min_tokens",
                    format!("`min_tokens` must be an integer between 0 and max_tokens, got {v}"),
                )
            })? as usize,
    };
    if spec.is_demo() {
        return tokio::task::spawn_blocking(move || demo_answer(&key, &messages, tools))
            .await
            .map_err(|_| ApiError::internal("an internal task failed"))?
            .map(Prepared::Done);
    }
    let fresh_seed = st.fresh_seed();
    let max_tokens = gen_fields
        .max_tokens
        .unwrap_or(512.min(st.cfg.max_tokens_cap));
    let registry_state = st.clone();
    blocking(move || {
        let model = registry_state.registry.model(&key)?;
        let t = (!tools.is_empty()).then_some(tools.as_slice());
        let prompt = model.template().render(
            &messages,
            t,
            RenderOptions {
                add_generation_prompt: true,
                enable_thinking: Some(spec.enable_thinking),
            },
        )?;
        let engine = model.engine().clone();
        let ids = engine.tokenize(&prompt)?;
        let mut request = GenerationRequest::new(ids)
            .max_new_tokens(max_tokens)
            .sampling(gen_fields.sampling(model.generation_config(), fresh_seed));
        request.stop = stop;
        request.ignore_eos = ignore_eos;
        request.min_tokens = min_tokens;
        engine.check(&request)?;
        Ok(Prepared::Model {
            engine,
            request,
            tools,
        })
    })
    .await
}

pub(super) fn tool_calls_json(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"index": i, "id": super::random_id("call"), "type": "function", "function": {"name": c.name, "arguments": Value::Object(c.arguments.clone()).to_string()}}))
        .collect()
}

pub(super) fn usage(c: &Completion) -> Value {
    json!({"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens, "total_tokens": c.prompt_tokens + c.completion_tokens, "prompt_tokens_details": {"cached_tokens": c.cached_tokens}})
}

fn count_error(st: &AppState) {
    st.counters
        .errors
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

pub(super) async fn chat(State(st): State<Arc<AppState>>, body: Bytes) -> ApiResult<Response> {
    st.counters
        .chat
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let result = async {
        let req: ChatRequest = parse(&body)?;
        let stream = flag("stream", req.stream.as_ref())?;
        let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
        let key = req.model.clone().unwrap_or_default();
        let prepared = prepare(&st, req).await?;
        let meta = ChunkMeta {
            id: super::random_id("chatcmpl"),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            key,
            include_usage,
        };
        let c = match prepared {
            Prepared::Model {
                engine,
                request,
                tools,
            } if stream => return Ok(stream_model(st.clone(), meta, engine, request, tools)),
            Prepared::Done(c) => c,
            Prepared::Model {
                engine,
                request,
                tools,
            } => to_completion(&engine.submit(request).await?, &tools),
        };
        st.counters
            .tokens(c.prompt_tokens, c.completion_tokens, c.cached_tokens);
        if stream {
            return Ok(stream_done(&meta, &c));
        }
        Ok(Json(completion_json(&meta, &c)).into_response())
    }
    .await;
    result.inspect_err(|_| count_error(&st))
}

fn completion_json(meta: &ChunkMeta, c: &Completion) -> Value {
    let calls = tool_calls_json(&c.calls);
    let content = if c.content.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        Value::String(c.content.clone())
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        let without_index: Vec<Value> = calls
            .into_iter()
            .map(|mut c| {
                c.as_object_mut().map(|o| o.remove("index"));
                c
            })
            .collect();
        message["tool_calls"] = Value::Array(without_index);
    }
    json!({"id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.key,
        "choices": [{"index": 0, "message": message, "finish_reason": c.finish, "logprobs": null}], "usage": usage(c)})
}
