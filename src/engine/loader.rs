//! Loading one rank's model: probe the checkpoint's dtype, resolve the compute dtype, open the
//! checkpoint in it and build this rank's shard of Qwen3. The head and the workers share it.
//!
//! Invariant: a load error names the model key (and, for a bad tensor, the tensor and file).

use std::path::PathBuf;

use candle_core::{DType, Device};

use super::DTypeChoice;
use super::config::ModelConfig;
use super::qwen3::{Qwen3, Shard};
use super::weights::Checkpoint;
use crate::error::{Error, Result};

/// The longest context any engine serves, whatever `max_position_embeddings` says: the RoPE
/// tables and request checks are sized to this.
pub const MAX_SERVED_CONTEXT: usize = 1 << 17;

/// The context an engine serves for `cfg`.
pub fn served_context(cfg: &ModelConfig) -> usize {
    cfg.max_position_embeddings.clamp(1, MAX_SERVED_CONTEXT)
}

/// Loads shard `shard` of the model `key` from `weights` on `device`, in `dtype` (`Auto`: the
/// checkpoint's on CUDA, f32 on the CPU). `progress` runs once per layer.
pub fn load_shard(
    key: &str,
    cfg: &ModelConfig,
    weights: &[PathBuf],
    dtype: DTypeChoice,
    device: &Device,
    shard: Shard,
    progress: impl FnMut(),
) -> Result<Qwen3> {
    let wrap = |e: Error| match e {
        e @ (Error::Checkpoint { .. } | Error::Unsupported(_) | Error::Load { .. }) => e,
        other => Error::Load {
            key: key.into(),
            reason: other.to_string(),
        },
    };
    let probe = Checkpoint::open(key, weights, DType::F32, device).map_err(wrap)?;
    let dtype = dtype.resolve(device, probe.stored_dtype());
    let layers = probe.layer_count();
    drop(probe);
    if layers != cfg.num_hidden_layers {
        return Err(Error::Load {
            key: key.into(),
            reason: format!(
                "config.json says num_hidden_layers = {} but the checkpoint holds {layers} layers; the config does not belong to these weights",
                cfg.num_hidden_layers
            ),
        });
    }
    let ck = Checkpoint::open(key, weights, dtype, device).map_err(wrap)?;
    Qwen3::load(
        cfg,
        &ck,
        dtype,
        device,
        shard,
        served_context(cfg),
        progress,
    )
    .map_err(wrap)
}

/// A progress bar over the layers of a load, on stderr (hidden when stderr is no terminal).
pub fn layer_progress(layers: usize, key: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::with_draw_target(
        Some(layers as u64),
        indicatif::ProgressDrawTarget::stderr(),
    );
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} layers ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb.set_message(format!("loading {key}"));
    pb
}
