//! Weight updates as the engine takes them: where new weights come from ([`WeightSource`]),
//! which weights produced a sample ([`WeightsVersion`]) and the content digest both paths
//! (files on disk, tensors pushed by a trainer) compute the same way.
//!
//! Invariant: the digest depends only on the tensors' names, dtypes, shapes and bytes, in
//! the order given, never on where they came from or on the machine.

use std::path::PathBuf;

use candle_core::DType;
use serde::Serialize;

use crate::digest::Hasher;

/// New weights for [`Engine::update_weights`](crate::engine::Engine::update_weights).
#[derive(Debug, Clone)]
pub enum WeightSource {
    /// A directory of safetensors files (a `save_pretrained` output, or the files alone)
    /// holding every tensor of the model under its HF name; a `config.json` there must
    /// describe the same shapes.
    Dir(PathBuf),
    /// Tensors already in host memory (a trainer's push), applied in order. Together they
    /// need not cover the model: tensors not named keep their values.
    Host(Vec<HostTensor>),
}

/// One named tensor in host memory, as a trainer sends it: HF name, dtype, shape and the
/// little-endian bytes (`numel * dtype size` of them).
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// HF name (`model.layers.3.mlp.up_proj.weight`).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Raw bytes.
    pub bytes: Vec<u8>,
}

/// Which weights produced a sample: a counter (0 = the weights loaded at start-up, +1 per
/// applied update) and a digest of their content (16 hex digits, see [`content_digest`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Default)]
pub struct WeightsVersion {
    /// 0 at load, then one more per update applied.
    pub version: u64,
    /// Digest of the tensors of the update that made this version (at load: of the
    /// checkpoint's tensors).
    pub digest: String,
    /// The LoRA adapter the sample ran through on top of these base weights (`None`: the
    /// base alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<AdapterVersion>,
}

/// Which version of a LoRA adapter produced a sample: its name, a counter (1 for the first
/// version loaded under the name, +1 per replacement) and the digest of its files.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Default)]
pub struct AdapterVersion {
    /// The name it was loaded under (the registry key).
    pub name: String,
    /// 1 for the first version under the name, then one more per replacement.
    pub version: u64,
    /// Digest of `adapter_config.json` and `adapter_model.safetensors` (16 hex digits).
    pub digest: String,
}

/// A LoRA adapter loaded into an engine ([`Engine::load_adapter`](crate::engine::Engine::load_adapter)):
/// what a request names ([`GenerationRequest::adapter`](crate::engine::GenerationRequest::adapter))
/// to run through it. Clonable; valid until the adapter is retired
/// ([`Engine::retire_adapter`](crate::engine::Engine::retire_adapter)).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AdapterHandle {
    pub(crate) id: u64,
    pub(crate) version: AdapterVersion,
    pub(crate) rank: usize,
}

impl AdapterHandle {
    /// The engine's id of this adapter version (unique per engine).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its name, version and digest.
    pub fn version(&self) -> &AdapterVersion {
        &self.version
    }

    /// Its largest rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
}

/// A 64-bit digest of named tensors (name, dtype, shape, bytes, in order), as 16 hex digits.
/// Tensors are hashed on all cores; it reads each byte once.
pub fn content_digest<'a>(tensors: &[(&'a str, DType, &'a [usize], &'a [u8])]) -> String {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut per: Vec<u64> = vec![0; tensors.len()];
    let chunk = tensors.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (out, ts) in per.chunks_mut(chunk).zip(tensors.chunks(chunk)) {
            s.spawn(move || {
                for (o, (name, dtype, shape, bytes)) in out.iter_mut().zip(ts) {
                    let mut h = Hasher::default();
                    h.bytes(name.as_bytes());
                    h.bytes(dtype.as_str().as_bytes());
                    for d in shape.iter() {
                        h.word(*d as u64);
                    }
                    h.bytes(bytes);
                    *o = h.finish();
                }
            });
        }
    });
    let mut h = Hasher::default();
    for p in per {
        h.word(p);
    }
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_tells_bytes_names_and_shapes_apart() {
        let a = vec![1u8; 100];
        let mut b = a.clone();
        b[77] = 2;
        let d = |name: &str, shape: &[usize], bytes: &[u8]| {
            content_digest(&[(name, DType::BF16, shape, bytes)])
        };
        let base = d("w", &[50], &a);
        assert_eq!(base, d("w", &[50], &a), "deterministic");
        assert_ne!(base, d("w", &[50], &b), "one byte changed");
        assert_ne!(base, d("v", &[50], &a), "name changed");
        assert_ne!(base, d("w", &[5, 10], &a), "shape changed");
        assert_eq!(base.len(), 16);
    }
}
