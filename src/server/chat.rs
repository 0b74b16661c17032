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

use super::completion::{
    Completion, logprob_json, to_completion, token_name, tool_calls_json, usage,
};
use super::completions::samples;
use super::error::{ApiError, ApiResult};
use super::openai::{ChatParams, ChatRequest, convert_messages, parse};
use super::state::{AppState, blocking, random_id};
use super::stream::{ChunkMeta, stream_done, stream_model};
use crate::engine::{Engine, GenerationRequest, TokenLogprob};
use crate::policy::format::{RenderOptions, ToolDefinition};
use crate::policy::{Action, DemoPolicy, EpisodeConfig, Observation, Policy};

/// A chat request ready to run: answered already (the demo), or generations to submit (one
/// per choice).
enum Prepared {
    Done(Completion),
    Model {
        engine: Engine,
        requests: Vec<GenerationRequest>,
        /// The tools the answers are parsed against (none with `tool_choice: "none"`).
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
        tier_tokens: (0, 0),
        weights_version: None,
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
        parse_calls,
        constraint,
        stop,
        ignore_eos,
        min_tokens,
        n,
        extras,
        logprobs,
        enable_thinking,
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
                enable_thinking: Some(enable_thinking.unwrap_or(spec.enable_thinking)),
            },
        )?;
        let engine = model.engine().clone();
        let ids = engine.tokenize(&prompt)?;
        let thinking = enable_thinking.unwrap_or(spec.enable_thinking);
        let mut sampling = generation.sampling(model.generation_config(), fresh_seed);
        sampling.top_k = extras.top_k.unwrap_or(sampling.top_k);
        sampling.min_p = extras.min_p;
        let mut request = GenerationRequest::new(ids).sampling(sampling);
        request.adapter = model.adapter();
        request.repetition_penalty = extras.repetition_penalty;
        request.stop = stop;
        request.ignore_eos = ignore_eos;
        request.min_tokens = min_tokens;
        request.logprobs = logprobs;
        if let Some(c) = &constraint {
            request.grammar = Some(c.compile(engine.grammar_compiler()?, &tools, thinking)?);
        }
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
        // The n choices: sample j seeded as /v1/completions seeds it.
        let requests = samples(request, n).collect();
        Ok(Prepared::Model {
            engine,
            requests,
            tools: if parse_calls { tools } else { Vec::new() },
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
        let (n, return_ids, tokens_as_ids) =
            (params.n, params.return_token_ids, params.tokens_as_ids);
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
        let (engine, requests, tools) = match prepared {
            Prepared::Model {
                engine,
                mut requests,
                tools,
            } if stream => {
                let request = requests.swap_remove(0);
                return Ok(stream_model(st.clone(), meta, engine, request, tools));
            }
            Prepared::Done(c) => {
                st.counters
                    .tokens(c.prompt_tokens, c.completion_tokens, c.cached_tokens);
                if stream {
                    return Ok(stream_done(&meta, &c));
                }
                let choices: Vec<Value> = (0..n).map(|i| choice_json(i, &c, None)).collect();
                return Ok(Json(chat_json(&meta, choices, None, usage(&c))).into_response());
            }
            Prepared::Model {
                engine,
                requests,
                tools,
            } => (engine, requests, tools),
        };
        let prompt_ids = requests[0].prompt.clone();
        // The prompts' samples (a GRPO group) start together: queued in one scheduler pass.
        let pending = engine.submit_batch(requests);
        let mut done = Vec::with_capacity(pending.len());
        for p in pending {
            done.push(p.await?);
        }
        let name = |t: u32| token_name(&engine, t, tokens_as_ids);
        let mut choices = Vec::with_capacity(done.len());
        let mut completion_tokens = 0;
        for (i, g) in done.iter().enumerate() {
            let c = to_completion(g, &tools);
            completion_tokens += c.completion_tokens;
            let mut v = choice_json(
                i,
                &c,
                g.logprobs.as_deref().map(|l| logprobs_json(l, &name)),
            );
            if return_ids {
                v["token_ids"] = json!(g.tokens);
            }
            v["weights_version"] = json!(g.weights_version.version);
            choices.push(v);
        }
        let first = to_completion(&done[0], &tools);
        let total = Completion {
            completion_tokens,
            ..first
        };
        st.counters
            .tokens(total.prompt_tokens, completion_tokens, total.cached_tokens);
        let ids = return_ids.then_some(prompt_ids.as_slice());
        let mut v = chat_json(&meta, choices, ids, usage(&total));
        v["weights_version"] = json!(done[0].weights_version);
        Ok(Json(v).into_response())
    }
    .await;
    result.inspect_err(|_| count_error(&st))
}

/// A chat choice's `logprobs` (OpenAI's chat layout): per token its name, log-probability,
/// bytes and the alternatives.
fn logprobs_json(lps: &[TokenLogprob], name: &dyn Fn(u32) -> String) -> Value {
    let entry = |t: u32, v: f32| {
        let n = name(t);
        json!({"token": n, "logprob": logprob_json(v), "bytes": n.as_bytes()})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = entry(lp.token, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|&(t, v)| entry(t, v)).collect();
            e
        })
        .collect();
    json!({"content": content})
}

/// The answer: its choices, the prompt's token ids when asked (vLLM's `prompt_token_ids`) and
/// the usage.
fn chat_json(
    meta: &ChunkMeta,
    choices: Vec<Value>,
    prompt_ids: Option<&[u32]>,
    usage: Value,
) -> Value {
    let mut v = json!({"id": meta.id, "object": "chat.completion", "created": meta.created,
        "model": meta.key, "choices": choices, "usage": usage});
    if let Some(ids) = prompt_ids {
        v["prompt_token_ids"] = json!(ids);
    }
    v
}

/// One choice: the message (content and tool calls), finish reason and `logprobs`.
fn choice_json(index: usize, c: &Completion, logprobs: Option<Value>) -> Value {
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
    json!({"index": index, "message": message, "finish_reason": c.finish,
        "logprobs": logprobs.unwrap_or(Value::Null)})
}
