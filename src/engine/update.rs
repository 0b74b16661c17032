//! Weight updates as the engine takes them: where new weights come from ([`WeightSource`]),
//! which weights produced a sample ([`WeightsVersion`]) and the content digest both paths
//! (files on disk, tensors pushed by a trainer) compute the same way.
//!
//! Invariant: the digest depends only on the tensors' names, dtypes, shapes and bytes, in
//! the order given, never on where they came from or on the machine.

use std::path::PathBuf;

use candle_core::DType;
use serde::Serialize;

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

/// A word-at-a-time multiplicative hash (not cryptographic: it tells versions apart, it does
/// not authenticate them).
struct Hasher {
    lanes: [u64; 4],
    len: u64,
}

impl Default for Hasher {
    fn default() -> Self {
        Self {
            lanes: [
                0x243f_6a88_85a3_08d3,
                0x1319_8a2e_0370_7344,
                0xa409_3822_299f_31d0,
                0x082e_fa98_ec4e_6c89,
            ],
            len: 0,
        }
    }
}

const K: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix(h: u64, w: u64) -> u64 {
    let x = (h ^ w).wrapping_mul(K);
    x ^ (x >> 29)
}

impl Hasher {
    fn word(&mut self, w: u64) {
        self.lanes[0] = mix(self.lanes[0], w);
        self.len += 8;
    }

    fn bytes(&mut self, b: &[u8]) {
        let mut blocks = b.chunks_exact(32);
        for blk in &mut blocks {
            for (i, lane) in self.lanes.iter_mut().enumerate() {
                let w = u64::from_le_bytes(blk[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
                *lane = mix(*lane, w);
            }
        }
        let rest = blocks.remainder();
        let mut words = rest.chunks(8);
        for w in &mut words {
            let mut buf = [0u8; 8];
            buf[..w.len()].copy_from_slice(w);
            self.lanes[0] = mix(self.lanes[0], u64::from_le_bytes(buf));
        }
        self.len += b.len() as u64;
        self.lanes[1] = mix(self.lanes[1], b.len() as u64);
    }

    fn finish(&self) -> u64 {
        let mut h = self.len;
        for l in self.lanes {
            h = mix(h, l);
        }
        h
    }
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
