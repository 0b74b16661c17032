//! The data the radix prefix cache hands out: a lookup's [`PrefixMatch`], its counters
//! ([`CacheStats`]) and an evicted node as the lower tiers see it ([`Evicted`]).

use serde::Serialize;

/// The result of a lookup: the cached blocks of the longest cached prefix, pinned until
/// [`RadixCache::release`](super::RadixCache::release) is called with `node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixMatch {
    /// The deepest matched node (pinned, with every ancestor).
    pub node: usize,
    /// Blocks of the matched prefix, in order.
    pub blocks: Vec<u32>,
    /// Matched tokens (`blocks.len() * block_size`).
    pub tokens: usize,
}

/// Counters of a radix cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CacheStats {
    /// Lookups made.
    pub lookups: u64,
    /// Tokens asked for in lookups.
    pub lookup_tokens: u64,
    /// Tokens found cached.
    pub hit_tokens: u64,
    /// Blocks evicted.
    pub evicted_blocks: u64,
    /// Blocks held by the tree now.
    pub cached_blocks: usize,
}

impl CacheStats {
    /// `hit_tokens / lookup_tokens` (0 when nothing was looked up).
    pub fn hit_rate(&self) -> f64 {
        if self.lookup_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.lookup_tokens as f64
        }
    }
}

/// A node leaving the tree by eviction, as [`RadixCache::evict_with`](super::RadixCache::evict_with)'s sink sees it.
#[derive(Debug)]
pub struct Evicted<'a> {
    /// Its namespace.
    pub ns: u64,
    /// Every token from its namespace's root to its end.
    pub tokens: &'a [u32],
    /// Its blocks: they hold the KV of the last `blocks.len()` whole blocks of `tokens`.
    pub blocks: &'a [u32],
}
