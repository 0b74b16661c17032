//! The routes an RL trainer's client reads besides generation, as vLLM answers them (TRL's
//! `VLLMClient`): `GET /get_world_size` (the ranks generation runs on: the trainer joins them
//! as rank 0 of its weight-sync group), `GET /server_info`, and `POST /reset_prefix_cache`
//! (after new weights the cached KV is stale).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::error::ApiResult;
use super::state::AppState;

/// The offered models that run an engine (the demo does not), in the order offered.
fn engine_keys(st: &AppState) -> Vec<String> {
    st.offered
        .iter()
        .filter(|k| st.registry.spec(k).is_ok_and(|s| !s.is_demo()))
        .cloned()
        .collect()
}

/// `GET /get_world_size`: `{"world_size": N}`, the ranks a model runs on: the most any loaded
/// model spans, or (none loaded yet) the tensor-parallel group the registry's options give.
pub(super) async fn world_size(State(st): State<Arc<AppState>>) -> Json<Value> {
    let configured = st
        .registry
        .options()
        .tensor_parallel
        .as_ref()
        .map_or(1, |c| c.0.world_size());
    let loaded = engine_keys(&st)
        .into_iter()
        .filter(|k| st.registry.is_loaded(k))
        .filter_map(|k| st.registry.model(&k).ok())
        .map(|m| m.engine().info().world_size)
        .max();
    Json(json!({"world_size": loaded.unwrap_or(configured)}))
}

/// `GET /server_info`: the crate's version and, per loaded model, how its engine is set up.
pub(super) async fn server_info(State(st): State<Arc<AppState>>) -> Json<Value> {
    let mut models = serde_json::Map::new();
    for key in engine_keys(&st) {
        if !st.registry.is_loaded(&key) {
            models.insert(key, json!({"loaded": false}));
            continue;
        }
        if let Ok(m) = st.registry.model(&key) {
            let i = m.engine().info();
            models.insert(
                key,
                json!({"loaded": true, "device": i.device, "dtype": format!("{:?}", i.dtype),
                    "kv_blocks": i.num_blocks, "block_size": i.block_size,
                    "max_context": i.max_context, "max_running": i.max_running,
                    "world_size": i.world_size, "cuda_graph_buckets": i.cuda_graph_buckets}),
            );
        }
    }
    Json(json!({"server": "policy-serve", "version": env!("CARGO_PKG_VERSION"), "models": models}))
}

/// `POST /reset_prefix_cache`: drops the cached prefixes of every loaded model (those running
/// requests use stay until they finish); answers the blocks freed per model.
pub(super) async fn reset_prefix_cache(State(st): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    let mut freed = serde_json::Map::new();
    for key in engine_keys(&st) {
        if !st.registry.is_loaded(&key) {
            continue;
        }
        let engine = st.registry.model(&key)?.engine().clone();
        freed.insert(key, json!(engine.reset_prefix_cache().await?));
    }
    Ok(Json(json!({"status": "ok", "freed_blocks": freed})))
}
