//! `HostTier`: KV blocks in host memory, keyed by their [`BlockKey`], least recently used
//! first out. It only stores and orders blocks; what moves where (and the byte budget it
//! shares with swapped-out sequences) is [`Tiers`](super::Tiers)' job.
//!
//! Invariant: `bytes` is the sum of the stored blocks' lengths; `lru` holds exactly one entry
//! per stored block, at its last access.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::keys::BlockKey;

/// Host memory holding one block's KV bytes (every layer's K and V): a plain buffer, or (on
/// CUDA) a slot of pinned memory a copy from the device may still be filling.
pub trait HostBuf: Send + Sync {
    /// The bytes (waiting first for a copy still filling them).
    fn bytes(&self) -> &[u8];
    /// Their length (without waiting).
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For a [`BlockIo`](super::BlockIo) to recognise buffers of its own kind.
    fn as_any(&self) -> &dyn std::any::Any;
}

impl HostBuf for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// One block's KV in host memory, shared between tiers without copying.
pub type BlockData = Arc<dyn HostBuf>;

struct Entry {
    data: BlockData,
    tick: u64,
}

/// Blocks in host memory, LRU-ordered.
#[derive(Default)]
pub struct HostTier {
    entries: HashMap<BlockKey, Entry>,
    lru: BTreeMap<u64, BlockKey>,
    bytes: usize,
    clock: u64,
}

impl HostTier {
    /// Whether `key` is stored.
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.entries.contains_key(key)
    }

    /// The block of `key` (marked as used now), if stored.
    pub fn get(&mut self, key: &BlockKey) -> Option<BlockData> {
        self.clock += 1;
        let e = self.entries.get_mut(key)?;
        self.lru.remove(&e.tick);
        e.tick = self.clock;
        self.lru.insert(self.clock, *key);
        Some(e.data.clone())
    }

    /// Stores a block (replacing one stored under the same key).
    pub fn insert(&mut self, key: BlockKey, data: BlockData) {
        self.remove(&key);
        self.clock += 1;
        self.bytes += data.len();
        self.lru.insert(self.clock, key);
        self.entries.insert(
            key,
            Entry {
                data,
                tick: self.clock,
            },
        );
    }

    /// Removes a block; returns it if it was stored.
    pub fn remove(&mut self, key: &BlockKey) -> Option<BlockData> {
        let e = self.entries.remove(key)?;
        self.lru.remove(&e.tick);
        self.bytes -= e.data.len();
        Some(e.data)
    }

    /// Removes and returns the least recently used block for which `skip` is false.
    pub fn pop_lru(&mut self, skip: impl Fn(&BlockKey) -> bool) -> Option<(BlockKey, BlockData)> {
        let key = self.lru.values().find(|k| !skip(k)).copied()?;
        self.remove(&key).map(|d| (key, d))
    }

    /// Blocks stored.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes stored.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
