//! The episodes API for harnesses: `POST /v1/episodes` opens an episode (a fresh policy),
//! `POST /v1/episodes/{id}/act` steps it, `DELETE /v1/episodes/{id}` closes it.
//!
//! Invariants: fields are validated by the same path as chat completions
//! ([`GenerationFields::validate`](super::openai::GenerationFields::validate)); the episode
//! cap holds; an idle episode expires after the TTL; a step runs off the async executor.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use parking_lot::Mutex;
use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};
use super::openai::{ActRequest, EpisodeRequest, model_key, parse, parse_tools, string_field};
use super::state::{AppState, Episode, blocking, random_id};
use crate::engine::CancelToken;
use crate::policy::{EpisodeConfig, Observation, TranscriptMode};

/// A reserved episode slot, given back when the create ends (inserted or failed).
struct Reservation(Arc<AppState>);

impl Drop for Reservation {
    fn drop(&mut self) {
        self.0.reserved_episodes.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(super) async fn create(
    State(st): State<Arc<AppState>>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let req: EpisodeRequest = parse(&body)?;
    let key = model_key(req.model.as_ref())?;
    let g = req.generation.validate(st.cfg.max_tokens_cap)?;
    let system_prompt = string_field("system_prompt", req.system_prompt.as_ref())?;
    st.check_model(&key)?;
    let (constraint, _) =
        super::openai::output_constraint(req.tool_choice.as_ref(), req.response_format.as_ref())?;
    let episode = EpisodeConfig {
        constraint,
        system_prompt,
        tools: parse_tools(req.tools.as_ref())?,
        max_new_tokens: g.max_tokens,
        temperature: g.temperature,
        top_p: g.top_p,
        max_transcript_tokens: st.cfg.max_transcript_tokens,
        seed: g.seed,
        transcript_mode: match req.transcript_mode.as_deref() {
            Some("append_only") => TranscriptMode::AppendOnly,
            None | Some("template") => TranscriptMode::Template,
            Some(other) => {
                return Err(ApiError::field(
                    "transcript_mode",
                    format!("`transcript_mode` `{other}`: use \"template\" or \"append_only\""),
                ));
            }
        },
    };
    // The slot is reserved before the (maybe long) load, under the same lock as the count, so
    // concurrent creates cannot pass the cap together.
    {
        let eps = st.episodes.lock();
        let reserved = st.reserved_episodes.load(Ordering::SeqCst);
        if eps.len() + reserved >= st.cfg.max_episodes {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_episodes",
                format!(
                    "{} episodes are open; DELETE finished ones",
                    st.cfg.max_episodes
                ),
            ));
        }
        st.reserved_episodes.fetch_add(1, Ordering::SeqCst);
    }
    let reservation = Reservation(st.clone());
    let policy = {
        let st = st.clone();
        let key = key.clone();
        blocking(move || st.registry.get_policy(&key, episode)).await?
    };
    let id = random_id("ep");
    let mut eps = st.episodes.lock();
    drop(reservation);
    eps.insert(
        id.clone(),
        Episode {
            policy: Arc::new(Mutex::new(policy)),
            last_used: Instant::now(),
            acts: Vec::new(),
        },
    );
    Ok((StatusCode::CREATED, Json(json!({"id": id, "model": key}))))
}

fn observation(v: Value) -> ApiResult<Observation> {
    match v {
        Value::String(s) => Ok(Observation::Text(s)),
        Value::Array(a) if a.is_empty() => Err(ApiError::field(
            "observation",
            "`observation` is an empty list: send the task, or one result per tool call",
        )),
        Value::Array(a) => Ok(Observation::ToolResults(
            a.into_iter()
                .map(|v| match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                })
                .collect(),
        )),
        _ => Err(ApiError::field(
            "observation",
            "`observation` must be a string or a list of strings (one per tool call)",
        )),
    }
}

/// A running act of an episode; when it drops (the act returned, failed or panicked) the act
/// no longer counts as running and the episode's idle time starts (if it is still open).
struct RunningAct {
    st: Arc<AppState>,
    id: String,
    token: CancelToken,
}

impl Drop for RunningAct {
    fn drop(&mut self) {
        if let Some(e) = self.st.episodes.lock().get_mut(&self.id) {
            e.acts.retain(|t| !t.same_as(&self.token));
            e.last_used = Instant::now();
        }
    }
}

pub(super) async fn act(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    st.counters.acts.fetch_add(1, Ordering::Relaxed);
    let req: ActRequest = parse(&body)?;
    let observation = observation(req.observation)?;
    // Cancelled when this handler is dropped (the client went away) or the episode is
    // deleted; the act then stops and leaves the episode exactly as it was.
    let token = CancelToken::new();
    let _cancel_when_dropped = token.cancel_on_drop();
    let policy = {
        let mut eps = st.episodes.lock();
        let ttl = Duration::from_secs(st.cfg.episode_ttl_secs);
        let e = eps
            .get_mut(&id)
            .filter(|e| !e.expired(ttl))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    "episode_not_found",
                    format!("episode `{id}` does not exist or expired"),
                )
            })?;
        e.acts.push(token.clone());
        e.policy.clone()
    };
    let running = RunningAct {
        st: st.clone(),
        id,
        token,
    };
    let step = blocking(move || {
        let result = policy.lock().act_cancellable(observation, &running.token);
        drop(running);
        result
    })
    .await?;
    let c = &step.cost;
    st.counters
        .tokens(c.prompt_tokens, c.generated_tokens, c.cached_prompt_tokens);
    Ok(Json(json!({
        "action": step.action,
        "raw": step.raw,
        "cost": {"prompt_tokens": c.prompt_tokens, "cached_prompt_tokens": c.cached_prompt_tokens,
                 "cached_prompt_tokens_host": c.cached_prompt_tokens_tiers.0,
                 "cached_prompt_tokens_disk": c.cached_prompt_tokens_tiers.1,
                 "generated_tokens": c.generated_tokens, "latency_ms": c.latency.as_secs_f64() * 1e3,
                 "weights_version": c.weights_version}
    })))
}

pub(super) async fn delete(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    match st.episodes.lock().remove(&id) {
        Some(e) => {
            // A running act stops and answers that its episode was closed.
            for t in &e.acts {
                t.cancel();
            }
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "episode_not_found",
            format!("episode `{id}` does not exist"),
        )),
    }
}
