//! `POST /v1/completions`: prompts (texts or token ids) x `n` samples become one generation
//! request each, all submitted at once; the answer lists the choices prompt-major (the `n`
//! samples of a prompt together), as vLLM does. The samples of one prompt share its prefill:
//! the engine admits the first and defers the others until its prompt is in the prefix cache
//! (`scheduler::memory`), so they start from the cached KV.
//!
//! Sample `j` of a request with seed `s` draws with seed `s` for `j = 0` (the same as a
//! one-sample request with that seed) and a seed mixed from `s` and `j` otherwise, so the
//! samples differ from each other and repeat from run to run.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::completion::{logprob_json, token_name};
use super::error::{ApiError, ApiResult};
use super::openai::{CompletionParams, CompletionRequest, MAX_CHOICES, Prompts, parse};
use super::state::{AppState, blocking, random_id};
use crate::engine::{Generation, GenerationRequest, TokenLogprob};

/// The `n` samples of `request` (chat and completions alike): sample `j` seeded as the module
/// docs say.
pub(super) fn samples(
    request: GenerationRequest,
    n: usize,
) -> impl Iterator<Item = GenerationRequest> {
    (0..n).map(move |j| {
        let mut r = request.clone();
        r.sampling.seed = sample_seed(request.sampling.seed, j);
        r
    })
}

/// The seed of sample `j` of a request seeded `seed` (SplitMix64's finalizer over both).
fn sample_seed(seed: u64, j: usize) -> u64 {
    if j == 0 {
        return seed;
    }
    let mut z = seed ^ (j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(super) async fn completions(
    State(st): State<Arc<AppState>>,
    body: Bytes,
) -> ApiResult<Response> {
    st.counters
        .completions
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let result = run(&st, &body).await;
    if result.is_err() {
        st.counters
            .errors
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    result
}

async fn run(st: &Arc<AppState>, body: &[u8]) -> ApiResult<Response> {
    let req: CompletionRequest = parse(body)?;
    let p = req.validate(st.cfg.max_tokens_cap, MAX_CHOICES)?;
    let spec = st.check_model(&p.key)?;
    if spec.is_demo() {
        return Err(ApiError::field(
            "model",
            format!(
                "`{}` is the scripted demo policy, which answers chat only; /v1/completions needs a model",
                p.key
            ),
        ));
    }
    let fresh_seed = st.fresh_seed();
    let state = st.clone();
    let (key, n, return_ids) = (p.key.clone(), p.n, p.return_token_ids);
    let tokens_as_ids = p.tokens_as_ids;
    let model_key = key.clone();
    // Tokenizing texts and checking every request is CPU work: off the executor.
    let (engine, prompts, requests) = blocking(move || {
        let model = state.registry.model(&key)?;
        let engine = model.engine().clone();
        let prompts: Vec<Vec<u32>> = match &p.prompts {
            Prompts::Ids(ids) => ids.clone(),
            Prompts::Text(texts) => texts
                .iter()
                .map(|t| engine.tokenize(t))
                .collect::<crate::error::Result<_>>()?,
        };
        let mut requests = build_requests(&p, &prompts, model.generation_config(), fresh_seed);
        for r in &mut requests {
            r.adapter = model.adapter();
            engine.check(r)?;
        }
        Ok((engine, prompts, requests))
    })
    .await?;
    // The prompts' samples (a GRPO group) start together: queued in one scheduler pass.
    let pending = engine.submit_batch(requests);
    let mut done = Vec::with_capacity(pending.len());
    for p in pending {
        done.push(p.await?);
    }
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    let completion_tokens: usize = done.iter().map(|g| g.generated_tokens).sum();
    // Cached prompt tokens are counted once per prompt: its first sample's.
    let cached: usize = done.iter().step_by(n).map(|g| g.cached_prompt_tokens).sum();
    let host: usize = done
        .iter()
        .step_by(n)
        .map(|g| g.cached_prompt_tokens_host)
        .sum();
    let disk: usize = done
        .iter()
        .step_by(n)
        .map(|g| g.cached_prompt_tokens_disk)
        .sum();
    st.counters.tokens(prompt_tokens, completion_tokens, cached);
    let name = |t: u32| token_name(&engine, t, tokens_as_ids);
    let choices: Vec<Value> = done
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut c = choice(i, g, return_ids.then(|| &prompts[i / n]));
            if let Some(lps) = &g.logprobs {
                c["logprobs"] = logprobs_json(lps, &name);
            }
            c
        })
        .collect();
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(Json(json!({
        "id": random_id("cmpl"),
        "object": "text_completion",
        "created": created,
        "model": model_key,
        "choices": choices,
        "weights_version": done.first().map(|g| &g.weights_version),
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached, "cached_tokens_host": host, "cached_tokens_disk": disk},
        },
    }))
    .into_response())
}

/// The generation requests of `p`, prompt-major: `n` per prompt.
pub fn build_requests(
    p: &CompletionParams,
    prompts: &[Vec<u32>],
    defaults: &crate::engine::GenerationConfig,
    fresh_seed: u64,
) -> Vec<GenerationRequest> {
    let mut out = Vec::with_capacity(prompts.len() * p.n);
    for ids in prompts {
        let mut sampling = p.generation.sampling(defaults, fresh_seed);
        sampling.top_k = p.extras.top_k.unwrap_or(sampling.top_k);
        sampling.min_p = p.extras.min_p;
        let mut r = GenerationRequest::new(ids.clone()).sampling(sampling);
        r.repetition_penalty = p.extras.repetition_penalty;
        r.max_new_tokens = p.generation.max_tokens;
        r.stop = p.stop.clone();
        r.ignore_eos = p.ignore_eos;
        r.min_tokens = p.min_tokens;
        r.logprobs = p.logprobs;
        out.extend(samples(r, p.n));
    }
    out
}

/// One choice: its text and finish reason, and with `prompt` (return_token_ids) the token ids
/// of its completion and of its prompt.
fn choice(index: usize, g: &Generation, prompt: Option<&Vec<u32>>) -> Value {
    let mut c = json!({"index": index, "text": g.text, "logprobs": null,
        "finish_reason": g.finish_reason.as_openai(), "stop_reason": null,
        "weights_version": g.weights_version.version});
    if let Some(prompt) = prompt {
        c["token_ids"] = json!(g.tokens);
        c["prompt_token_ids"] = json!(prompt);
    }
    c
}

/// A completion choice's `logprobs` (the OpenAI completions layout): the tokens, their
/// log-probabilities, per position the alternatives by name (the generated token's included,
/// as vLLM does) and the tokens' offsets in the text.
fn logprobs_json(lps: &[TokenLogprob], name: &dyn Fn(u32) -> String) -> Value {
    let mut offset = 0usize;
    let (mut tokens, mut values, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for lp in lps {
        let t = name(lp.token);
        offsets.push(offset);
        offset += t.len();
        let mut top = serde_json::Map::new();
        for &(id, v) in &lp.top {
            top.insert(name(id), logprob_json(v));
        }
        top.insert(t.clone(), logprob_json(lp.logprob));
        tokens.push(Value::String(t));
        values.push(logprob_json(lp.logprob));
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
}
