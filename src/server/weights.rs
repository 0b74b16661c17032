//! New weights over HTTP, behind `--allow-weight-updates` (403 naming the flag otherwise):
//! `POST /v1/models/{key}/weights` reads them from a directory on the server's disk; vLLM's
//! NCCL weight transfer, as TRL's `VLLMClient` drives it, receives them from a trainer:
//! `POST /init_weight_transfer_engine` joins the trainer's group, `/start_weight_update`
//! opens an update, each `/update_weights` receives the tensors it announces into host
//! memory, `/finish_weight_update` applies them all at once. Both paths end in the engine's
//! one update (`Engine::update_weights`): requests running on the old weights finish on them,
//! the prefix cache is dropped, the version goes up.
//!
//! Invariants: a failure (an unknown name, a wrong shape, a broken link) aborts the update,
//! keeps the old weights serving and answers 400 with the reason, never 5xx (a client retries
//! a 5xx after it has already broadcast); announced tensors are always received, even when
//! the update is already refused (a name the model lacks, a shape, a dtype it cannot take),
//! so a trainer in the middle of its broadcast never hangs; only an announcement that cannot
//! be sized (a malformed `update_info`, a dtype name torch does not have) is refused before.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};
use super::state::{AppState, TransferSession, blocking};
use crate::engine::parallel::transfer::{InitInfo, TrainerLink, parse_update_info};
use crate::engine::{Engine, WeightSource};
use crate::error::Error;

/// How long joining a trainer's group may take (its store and its NCCL init).
const JOIN_TIMEOUT: Duration = Duration::from_secs(300);

fn gate(st: &AppState) -> ApiResult<()> {
    if st.cfg.allow_weight_updates {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "weight_updates_disabled",
            "weight updates are off; start the server with --allow-weight-updates (and --token beyond loopback)",
        ))
    }
}

fn json_body(body: &Bytes) -> ApiResult<Value> {
    if body.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))
}

/// The engine of `key`, loaded.
async fn engine_of(st: &Arc<AppState>, key: &str) -> ApiResult<Engine> {
    if !st.offered.iter().any(|k| k == key) {
        return Err(Error::UnknownModel {
            key: key.to_string(),
            known: st.offered.join(", "),
        }
        .into());
    }
    let state = st.clone();
    let k = key.to_string();
    blocking(move || state.registry.model(&k).map(|m| m.engine().clone())).await
}

/// The model a trainer's group updates: `init_info.model` when given, else the first offered
/// model that is loaded (the one the trainer generates with), else the first with weights.
fn transfer_key(st: &AppState, asked: Option<&str>) -> ApiResult<String> {
    if let Some(k) = asked {
        return Ok(k.to_string());
    }
    let with_weights = || {
        st.offered
            .iter()
            .filter(|k| st.registry.spec(k).is_ok_and(|s| !s.is_demo()))
    };
    with_weights()
        .find(|k| st.registry.is_loaded(k))
        .or_else(|| with_weights().next())
        .cloned()
        .ok_or_else(|| ApiError::bad("no model with weights is offered (the demo has none)"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiskUpdate {
    /// A directory on the server holding the new safetensors files.
    path: std::path::PathBuf,
    /// Let running requests finish on the old weights (default) or end them.
    #[serde(default = "yes")]
    drain: bool,
}

fn yes() -> bool {
    true
}

/// `POST /v1/models/{key}/weights` `{"path": DIR, "drain": true}`: new weights from disk.
pub(super) async fn from_disk(
    State(st): State<Arc<AppState>>,
    Path(key): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    gate(&st)?;
    let req: DiskUpdate = serde_json::from_value(json_body(&body)?)
        .map_err(|e| ApiError::bad(format!("expected {{\"path\": DIR, \"drain\": bool}}: {e}")))?;
    let engine = engine_of(&st, &key).await?;
    let adapter = st.registry.spec(&key).is_ok_and(|s| s.adapter_of.is_some());
    let v = if adapter {
        // An adapter key: its new version (checked, then swapped in; the base untouched).
        let (state, k) = (st.clone(), key.clone());
        blocking(move || {
            state
                .registry
                .update_weights(&k, WeightSource::Dir(req.path), req.drain)
        })
        .await?
    } else {
        engine
            .update_weights(WeightSource::Dir(req.path), req.drain)
            .await?
    };
    Ok(Json(json!({"model": key, "weights_version": v})))
}

/// `POST /init_weight_transfer_engine` `{"init_info": {master_address, master_port,
/// rank_offset, world_size, packed?}}`: joins the trainer's group (blocks until the trainer
/// joins too, as vLLM does).
pub(super) async fn init(State(st): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    gate(&st)?;
    let v = json_body(&body)?;
    let v = v.get("init_info").cloned().unwrap_or(v);
    let asked = v.get("model").and_then(Value::as_str).map(str::to_string);
    let info: InitInfo = serde_json::from_value(v).map_err(|e| {
        ApiError::bad(format!(
            "init_info needs master_address, master_port, rank_offset and world_size: {e}"
        ))
    })?;
    let key = transfer_key(&st, asked.as_deref())?;
    let engine = engine_of(&st, &key).await?;
    let world = engine.info().world_size;
    if world != 1 {
        return Err(ApiError::bad(format!(
            "`{key}` runs on {world} tensor-parallel ranks; weights pushed over NCCL reach one-rank engines only for now (use POST /v1/models/{key}/weights)"
        )));
    }
    if info.world_size != info.rank_offset + world {
        return Err(ApiError::bad(format!(
            "init_info.world_size is {} but rank_offset {} + this server's {world} rank(s) make {}",
            info.world_size,
            info.rank_offset,
            info.rank_offset + world
        )));
    }
    let device = engine.device().clone();
    let slot = st.transfer.clone();
    let (rank, world) = blocking(move || {
        let link = TrainerLink::join(&info, &device, JOIN_TIMEOUT)?;
        let rank_world = link.rank_and_world();
        *slot.lock() = Some(TransferSession {
            key,
            link,
            packed: info.packed,
            buffer_bytes: info.packed_buffer_size_bytes,
            staged: Vec::new(),
            aborted: None,
        });
        Ok(rank_world)
    })
    .await?;
    Ok(Json(
        json!({"success": true, "rank": rank, "world_size": world}),
    ))
}

/// The weight-transfer session without blocking the async executor: while a receive holds
/// it (seconds), other weight-transfer calls answer 409.
fn session(st: &AppState) -> ApiResult<parking_lot::MutexGuard<'_, Option<TransferSession>>> {
    st.transfer.try_lock().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "weight_transfer_busy",
            "a weight transfer is receiving tensors; retry when it has finished",
        )
    })
}

fn no_session() -> ApiError {
    ApiError::bad("no weight-transfer group: POST /init_weight_transfer_engine first")
}

/// `POST /start_weight_update`: opens an update (drops anything staged before).
pub(super) async fn start(State(st): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    gate(&st)?;
    let mut slot = session(&st)?;
    let s = slot.as_mut().ok_or_else(no_session)?;
    s.staged.clear();
    s.aborted = None;
    Ok(Json(json!({"success": true})))
}

/// `POST /update_weights` `{"update_info": {names, dtype_names, shapes, packed?}}`: receives
/// the announced tensors from the trainer's broadcast into host memory.
pub(super) async fn update(State(st): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    gate(&st)?;
    let v = json_body(&body)?;
    let info = v.get("update_info").cloned().unwrap_or(v);
    let announced = parse_update_info(&info)?;
    let packed_here = info.get("packed").and_then(Value::as_bool);
    let key = session(&st)?
        .as_ref()
        .map(|s| s.key.clone())
        .ok_or_else(no_session)?;
    let cfg = st.registry.model(&key)?.config().clone();
    let slot = st.transfer.clone();
    let n = announced.len();
    let outcome = blocking(move || {
        let mut guard = slot.lock();
        let s = guard
            .as_mut()
            .ok_or_else(|| Error::WeightUpdate("the weight-transfer group was closed".into()))?;
        let packed = packed_here.unwrap_or(s.packed);
        // Checked first, received anyway (the trainer is broadcasting already).
        let refused = announced.iter().find_map(|t| {
            match t.dtype {
                Some(d) => crate::engine::model::update::check_tensor(&cfg, &t.name, &t.shape, d).err(),
                None => Some(Error::WeightUpdate(format!(
                    "tensor `{}`: dtype `{}` cannot be loaded into the model; send bfloat16, float16 or float32",
                    t.name, t.torch_dtype
                ))),
            }
        });
        let received = s.link.receive(&announced, packed, s.buffer_bytes);
        match (refused, received) {
            (_, Err(e)) => {
                // The link is broken: the group is gone with it.
                *guard = None;
                Err(e)
            }
            (Some(e), Ok(_)) => {
                s.aborted = Some(e.to_string());
                Err(e)
            }
            (None, Ok(tensors)) => {
                s.staged.extend(tensors);
                Ok(s.staged.len())
            }
        }
    })
    .await?;
    Ok(Json(
        json!({"success": true, "received": n, "staged": outcome}),
    ))
}

/// `POST /finish_weight_update`: applies every tensor received since `/start_weight_update`
/// (requests running on the old weights finish first), or reports why the update was
/// refused.
pub(super) async fn finish(State(st): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    gate(&st)?;
    let (key, staged, aborted) = {
        let mut slot = session(&st)?;
        let s = slot.as_mut().ok_or_else(no_session)?;
        (
            s.key.clone(),
            std::mem::take(&mut s.staged),
            s.aborted.take(),
        )
    };
    if let Some(reason) = aborted {
        return Err(Error::WeightUpdate(format!("this update was aborted: {reason}")).into());
    }
    let engine = engine_of(&st, &key).await?;
    if staged.is_empty() {
        return Ok(Json(json!({"success": true, "applied": 0})));
    }
    let n = staged.len();
    let v = engine
        .update_weights(WeightSource::Host(staged), true)
        .await?;
    Ok(Json(
        json!({"success": true, "applied": n, "weights_version": v}),
    ))
}
