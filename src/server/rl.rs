//! The routes an RL trainer's client reads besides generation, as vLLM answers them (TRL's
//! `VLLMClient`): `GET /get_world_size` (the ranks generation runs on: the trainer joins them
//! as rank 0 of its weight-sync group), `GET /server_info`, and `POST /reset_prefix_cache`
//! (after new weights the cached KV is stale).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::error::ApiResult;
use super::state::{AppState, blocking};

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

/// `GET /server_info`: per loaded model how its engine is set up, and `vllm_config`, the
/// parts of vLLM's resolved configuration a trainer reads, for the first loaded model:
/// `model_config` (`logprobs_mode` is `processed_logprobs`: log-probs of the distribution
/// drawn from), `parallel_config`, `lora_config` (none) and `weight_transfer_config` (NCCL
/// when weights may be pushed). Loads the first offered model if none is loaded (a
/// trainer asks before its first generation).
pub(super) async fn server_info(State(st): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    let keys = engine_keys(&st);
    if let Some(first) = keys.first().cloned()
        && !keys.iter().any(|k| st.registry.is_loaded(k))
    {
        let state = st.clone();
        blocking(move || state.registry.model(&first).map(|_| ())).await?;
    }
    let mut vllm_config = Value::Null;
    let mut models = serde_json::Map::new();
    for key in keys {
        if !st.registry.is_loaded(&key) {
            models.insert(key, json!({"loaded": false}));
            continue;
        }
        if let Ok(m) = st.registry.model(&key) {
            let i = m.engine().info();
            if vllm_config.is_null() {
                vllm_config = json!({
                    "model_config": {"model": key, "served_model_name": key,
                        "dtype": format!("{:?}", i.dtype).to_lowercase(),
                        "max_model_len": i.max_context, "logprobs_mode": "processed_logprobs"},
                    "parallel_config": {"tensor_parallel_size": i.world_size,
                        "data_parallel_size": 1, "world_size": i.world_size},
                    "cache_config": {"block_size": i.block_size, "num_gpu_blocks": i.num_blocks,
                        "enable_prefix_caching": true},
                    "scheduler_config": {"max_num_seqs": i.max_running},
                    "lora_config": null,
                    "weight_transfer_config": weight_transfer_config(&st),
                });
            }
            models.insert(
                key,
                json!({"loaded": true, "device": i.device, "dtype": format!("{:?}", i.dtype),
                    "kv_blocks": i.num_blocks, "block_size": i.block_size,
                    "max_context": i.max_context, "max_running": i.max_running,
                    "world_size": i.world_size, "cuda_graph_buckets": i.cuda_graph_buckets}),
            );
        }
    }
    Ok(Json(
        json!({"server": "policy-serve", "version": env!("CARGO_PKG_VERSION"),
        "models": models, "vllm_config": vllm_config}),
    ))
}

/// vLLM's `weight_transfer_config`: `{"backend": "nccl"}` when weights may be pushed
/// (`--allow-weight-updates` on a build with NCCL), else null (a trainer's client then says
/// the server takes no weights).
fn weight_transfer_config(st: &AppState) -> Value {
    if st.cfg.allow_weight_updates && cfg!(feature = "nccl") {
        json!({"backend": "nccl"})
    } else {
        Value::Null
    }
}

/// `POST /reset_prefix_cache`: drops the cached prefixes of every loaded model (those running
/// requests use stay until they finish); answers `{"success": true}` as vLLM does, with the
/// blocks freed per model.
pub(super) async fn reset_prefix_cache(State(st): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    let mut freed = serde_json::Map::new();
    for key in engine_keys(&st) {
        if !st.registry.is_loaded(&key) {
            continue;
        }
        let engine = st.registry.model(&key)?.engine().clone();
        freed.insert(key, json!(engine.reset_prefix_cache().await?));
    }
    Ok(Json(json!({"success": true, "freed_blocks": freed})))
}
