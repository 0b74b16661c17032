//! Loading one rank's model: probe the checkpoint's dtype, resolve the compute dtype, open the
//! checkpoint in it and build this rank's shard of Qwen3. The head and the workers share it.
//!
//! Invariant: a load error names the model key (and, for a bad tensor, the tensor and file).

use std::path::PathBuf;

use candle_core::{DType, Device};

use super::config::ModelConfig;
use super::forward::{Model, kernels_for};
use super::qwen3::Qwen3;
use super::shard::Shard;
use super::weights::Checkpoint;
use crate::engine::device::DTypeChoice;
use crate::engine::options::KernelOptions;
use crate::error::{Error, Result};

/// The longest context any engine serves, whatever `max_position_embeddings` says: the RoPE
/// tables and request checks are sized to this.
pub const MAX_SERVED_CONTEXT: usize = 1 << 17;

/// The context an engine serves for `cfg`.
pub fn served_context(cfg: &ModelConfig) -> usize {
    cfg.max_position_embeddings.clamp(1, MAX_SERVED_CONTEXT)
}

/// Loads shard `shard` of the model `key` from `weights` on `device`, in `dtype` (`Auto`: the
/// checkpoint's on CUDA, f32 on the CPU), with the kernels `kernels` allows. `progress` runs
/// once per layer.
#[allow(clippy::too_many_arguments)]
pub fn load_shard(
    key: &str,
    cfg: &ModelConfig,
    weights: &[PathBuf],
    dtype: DTypeChoice,
    device: &Device,
    shard: Shard,
    kernels: &KernelOptions,
    progress: impl FnMut(),
) -> Result<Model> {
    let wrap = |e: Error| e.loading(key);
    let probe = Checkpoint::open(key, weights, DType::F32, device).map_err(wrap)?;
    let dtype = dtype.resolve(device, probe.stored_dtype());
    let (layers, top) = (probe.layer_count(), probe.max_layer_index());
    drop(probe);
    if layers != cfg.num_hidden_layers {
        let holds = match top {
            None => "no layer tensors".to_string(),
            Some(t) => format!("layer tensors up to model.layers.{t}"),
        };
        return Err(Error::Load {
            key: key.into(),
            reason: format!(
                "config.json says num_hidden_layers = {} but the checkpoint holds {holds}; the config does not belong to these weights",
                cfg.num_hidden_layers
            ),
        });
    }
    let ck = Checkpoint::open(key, weights, dtype, device).map_err(wrap)?;
    let kernels = kernels_for(cfg, device, dtype, kernels).map_err(wrap)?;
    let qwen3 = Qwen3::load(
        cfg,
        &ck,
        dtype,
        device,
        shard,
        served_context(cfg),
        kernels.as_ref(),
        progress,
    )
    .map_err(wrap)?;
    #[cfg(not(feature = "cuda"))]
    let _ = kernels;
    Ok(Model {
        qwen3,
        #[cfg(feature = "cuda")]
        kernels,
    })
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
