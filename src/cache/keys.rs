//! Block keys of the lower KV tiers: a block is named by a digest of everything its KV
//! depends on (the model's weights, the prefix-cache namespace, the block size and KV layout,
//! and every token up to the block's end), chained block by block. Equal keys mean equal KV,
//! across processes: a restarted engine over the same weights finds the blocks a previous one
//! wrote to disk, and an engine over other weights, or another block size or dtype, never does.

use crate::digest::Hasher;

/// The 128-bit name of one block of KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey(pub u128);

impl BlockKey {
    /// 32 hex digits (the disk tier's file name).
    pub fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }

    /// Parses [`BlockKey::hex`]'s output.
    pub fn from_hex(s: &str) -> Option<Self> {
        (s.len() == 32)
            .then(|| u128::from_str_radix(s, 16).ok())
            .flatten()
            .map(Self)
    }
}

fn hash128(parts: impl Fn(&mut Hasher)) -> u128 {
    let mut lo = Hasher::default();
    let mut hi = Hasher::default();
    hi.word(0x5bd1_e995_5bd1_e995);
    parts(&mut lo);
    parts(&mut hi);
    ((hi.finish() as u128) << 64) | lo.finish() as u128
}

/// What a chain of keys starts from: the model (its weights' digest and KV layout) and the
/// block size; [`KeySeed::chain`] adds the namespace and the tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySeed {
    seed: u128,
    block_size: usize,
}

impl KeySeed {
    /// `model` names the weights (their content digest), `layout` the KV's form (dtype,
    /// layers, KV heads, head dim: anything that changes the bytes of a block).
    pub fn new(model: &str, layout: &str, block_size: usize) -> Self {
        let seed = hash128(|h| {
            h.bytes(b"policy-serve kv v1");
            h.bytes(model.as_bytes());
            h.bytes(layout.as_bytes());
            h.word(block_size as u64);
        });
        Self {
            seed,
            block_size: block_size.max(1),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The keys of the whole blocks of `tokens` in namespace `ns` (a trailing partial block
    /// has none): key `i` covers tokens `..(i + 1) * block_size`.
    pub fn chain(&self, ns: u64, tokens: &[u32]) -> Vec<BlockKey> {
        let mut prev = hash128(|h| {
            h.word(self.seed as u64);
            h.word((self.seed >> 64) as u64);
            h.word(ns);
        });
        tokens
            .chunks_exact(self.block_size)
            .map(|blk| {
                prev = hash128(|h| {
                    h.word(prev as u64);
                    h.word((prev >> 64) as u64);
                    for &t in blk {
                        h.word(t as u64);
                    }
                });
                BlockKey(prev)
            })
            .collect()
    }
}

/// The checksum of a block's bytes as the disk tier stores it.
pub fn checksum(data: &[u8]) -> u64 {
    let mut h = Hasher::default();
    h.bytes(data);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_the_whole_prefix_the_model_the_namespace_and_the_layout() {
        let s = KeySeed::new("w1", "bf16", 2);
        let a = s.chain(0, &[1, 2, 3, 4, 5]);
        assert_eq!(a.len(), 2, "the partial block has no key");
        assert_eq!(s.chain(0, &[1, 2, 3, 4]), a, "deterministic");
        assert_eq!(s.chain(0, &[1, 2, 9, 9])[0], a[0]);
        assert_ne!(
            s.chain(0, &[9, 2, 3, 4])[1],
            a[1],
            "an earlier token changes later keys"
        );
        assert_ne!(s.chain(1, &[1, 2, 3, 4]), a, "namespace");
        assert_ne!(KeySeed::new("w2", "bf16", 2).chain(0, &[1, 2, 3, 4]), a);
        assert_ne!(KeySeed::new("w1", "f32", 2).chain(0, &[1, 2, 3, 4]), a);
        assert_ne!(
            KeySeed::new("w1", "bf16", 4).chain(0, &[1, 2, 3, 4])[0],
            a[1]
        );
        assert_eq!(BlockKey::from_hex(&a[1].hex()), Some(a[1]));
    }
}
