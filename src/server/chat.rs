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

use super::completion::{Completion, to_completion, tool_calls_json, usage};
use super::error::{ApiError, ApiResult};
use super::openai::{ChatParams, ChatRequest, convert_messages, parse};
use super::state::{AppState, blocking, random_id};
use super::stream::{ChunkMeta, stream_done, stream_model};
use crate::engine::{Engine, GenerationRequest};
use crate::policy::format::{RenderOptions, ToolDefinition};
use crate::policy::{Action, DemoPolicy, EpisodeConfig, Observation, Policy};

/// A chat request ready to run: answered already (the demo), or a generation to submit.
enum Prepared {
    Done(Completion),
    Model {
        engine: Engine,
        request: GenerationRequest,
        tools: Vec<ToolDefinition>,
    },
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

async fn prepare(st: &Arc<AppState>, req: ChatRequest, p: ChatParams) -> ApiResult<Prepared> {
    let spec = st.check_model(&p.key)?;
    // Converting (and for the demo, answering) a long conversation is CPU work: off the
    // executor, like rendering and tokenizing below.
    let raw_messages = req.messages;
    let messages = tokio::task::spawn_blocking(move || convert_messages(&raw_messages))
        .await
        .map_err(|_| ApiError::internal("an internal task failed"))??;
    let ChatParams {
        key,
        generation,
        tools,
        stop,
        ignore_eos,
        min_tokens,
        ..
    } = p;
    if spec.is_demo() {
        return tokio::task::spawn_blocking(move || demo_answer(&key, &messages, tools))
            .await
            .map_err(|_| ApiError::internal("an internal task failed"))?
            .map(Prepared::Done);
    }
    let fresh_seed = st.fresh_seed();
    let cap = st.cfg.max_tokens_cap;
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
            .sampling(generation.sampling(model.generation_config(), fresh_seed));
        request.stop = stop;
        request.ignore_eos = ignore_eos;
        request.min_tokens = min_tokens;
        request.max_new_tokens = generation.max_tokens.or_else(|| {
            // No `max_tokens`: the room the prompt leaves in the context (as OpenAI and vLLM
            // do), within the server's cap; none left is refused by the check below.
            let room = engine
                .info()
                .room()
                .saturating_sub(request.prompt.len())
                .min(cap);
            (room > 0).then_some(room)
        });
        engine.check(&request)?;
        Ok(Prepared::Model {
            engine,
            request,
            tools,
        })
    })
    .await
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
        let params = req.validate(st.cfg.max_tokens_cap)?;
        let (stream, include_usage, key) =
            (params.stream, params.include_usage, params.key.clone());
        let prepared = prepare(&st, req, params).await?;
        let meta = ChunkMeta {
            id: random_id("chatcmpl"),
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
