//! The KV cache's storage dtype (`EngineOptions::kv_dtype`) resolved against the model and
//! device, and an fp8 cache's per-layer scales: the checkpoint's `k_scale` / `v_scale` tensors
//! when it has them, otherwise a calibration pass at start-up: one prefill of a fixed prompt
//! into a small cache in the compute dtype, each layer's K and V amax / 448.

use std::path::PathBuf;

use candle_core::{DType, Device};

use crate::engine::batch::{LogitRows, SeqInput};
use crate::engine::kv_format::KvScale;
use crate::engine::model::Model;
use crate::engine::model::config::ModelConfig;
use crate::engine::model::kv_cache::PagedKvCache;
use crate::engine::model::weights::Checkpoint;
use crate::engine::options::KvCacheDtype;
use crate::engine::parallel::comm::CommBackend;
use crate::error::{Error, Result};

/// Tokens of the calibration prompt.
pub const CALIBRATION_TOKENS: usize = 512;

/// The cache's storage dtype for `choice` on this model (an error says why a choice cannot
/// be served: fp8 on a GPU without fp8, bf16 under f32 kernels).
pub(crate) fn kv_dtype(choice: KvCacheDtype, model: &Model) -> Result<DType> {
    let compute = model.dtype();
    let refuse = |why: String| {
        Err(Error::InvalidInput(format!(
            "--kv-cache-dtype {}: {why}",
            match choice {
                KvCacheDtype::Auto => "auto",
                KvCacheDtype::Bf16 => "bf16",
                KvCacheDtype::Fp8 => "fp8",
            }
        )))
    };
    match choice {
        KvCacheDtype::Auto => Ok(compute),
        KvCacheDtype::Bf16 if compute == DType::BF16 || !model.uses_kernels() => Ok(DType::BF16),
        KvCacheDtype::Bf16 => refuse(format!(
            "the CUDA kernels keep KV in the compute dtype ({compute:?}); use auto or --dtype bf16"
        )),
        KvCacheDtype::Fp8 => match model.fp8_kv() {
            Ok(()) => Ok(DType::F8E4M3),
            Err(why) => refuse(why),
        },
    }
}

/// The checkpoint's per-layer scales (`model.layers.{i}.self_attn.k_scale` and `v_scale`,
/// one value each), `None` when it has none; an error names a tensor of the wrong shape or
/// value, or a layer missing one.
pub(crate) fn checkpoint_scales(
    key: &str,
    cfg: &ModelConfig,
    weights: &[PathBuf],
) -> Result<Option<Vec<KvScale>>> {
    let ck = Checkpoint::open(key, weights, DType::F32, &Device::Cpu)?;
    let name = |i: usize, kv: &str| format!("model.layers.{i}.self_attn.{kv}_scale");
    if !(0..cfg.num_hidden_layers).any(|i| ck.has(&name(i, "k")) || ck.has(&name(i, "v"))) {
        return Ok(None);
    }
    let shapes: std::collections::HashMap<String, Vec<usize>> = ck
        .tensors()
        .map(|(n, s, _)| (n.to_string(), s.to_vec()))
        .collect();
    let read = |t: String| -> Result<f32> {
        let bad = |reason: String| Error::Checkpoint {
            tensor: t.clone(),
            file: ck.file_of(&t),
            reason,
        };
        let shape = shapes
            .get(&t)
            .ok_or_else(|| bad("missing (the other layers have KV scales)".into()))?;
        if shape.iter().product::<usize>() != 1 {
            return Err(bad(format!(
                "a KV scale must be one value per layer (shape [] or [1]), not {shape:?}"
            )));
        }
        let v = ck
            .get(&t, shape)?
            .flatten_all()?
            .to_vec1::<f32>()?
            .first()
            .copied()
            .unwrap_or(f32::NAN);
        if !(v.is_finite() && v > 0.0) {
            return Err(bad(format!(
                "a KV scale must be finite and positive, not {v}"
            )));
        }
        Ok(v)
    };
    (0..cfg.num_hidden_layers)
        .map(|i| {
            Ok(KvScale {
                k: read(name(i, "k"))?,
                v: read(name(i, "v"))?,
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The calibration prompt: fixed ids spread over the vocabulary's ordinary tokens.
fn calibration_ids(vocab: usize) -> Vec<u32> {
    let n = vocab.clamp(1, 151_643) as u64;
    (0..CALIBRATION_TOKENS as u64)
        .map(|i| ((i * 2_654_435_761 + 12_345) % n) as u32)
        .collect()
}

/// Scales from one prefill of the calibration prompt into a cache in the compute dtype: per
/// layer, the largest |K| and |V| written / 448 (this rank's KV heads; under tensor
/// parallelism every rank runs it at once, `comm` pairing the collectives).
pub(crate) fn calibrate(
    model: &Model,
    cfg: &ModelConfig,
    block_size: usize,
    comm: Option<&dyn CommBackend>,
) -> Result<Vec<KvScale>> {
    let ids = calibration_ids(cfg.vocab_size);
    let blocks = ids.len().div_ceil(block_size);
    let cache = PagedKvCache::new(
        cfg,
        model.local_kv_heads(),
        blocks,
        block_size,
        model.dtype(),
        model.device(),
    )?;
    let table: Vec<u32> = (0..blocks as u32).collect();
    let seq = SeqInput {
        q_len: ids.len(),
        context_len: ids.len(),
        block_table: &table,
        logits: LogitRows::None,
        adapter: None,
    };
    model.forward(&ids, &[seq], &cache, comm)?;
    let amax = |t: &candle_core::Tensor| -> Result<f32> {
        Ok(t.to_dtype(DType::F32)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?)
    };
    (0..cfg.num_hidden_layers)
        .map(|li| {
            let kv = cache.layer(li);
            Ok(KvScale::from_amax(amax(kv.k)?, amax(kv.v)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calibration_prompt_is_fixed_and_within_the_vocabulary() {
        let a = calibration_ids(1000);
        assert_eq!(a, calibration_ids(1000));
        assert_eq!(a.len(), CALIBRATION_TOKENS);
        assert!(a.iter().all(|&t| t < 1000));
        assert!(calibration_ids(200_000).iter().all(|&t| t < 151_643));
    }
}
