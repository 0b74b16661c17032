//! `Tiers`: the KV tiers below the GPU (pinned host memory, then local disk) for blocks the
//! prefix cache evicts. A block evicted from the GPU is copied to host (unless a tier below
//! already holds it); host blocks past the host budget move to disk; only the lowest tier
//! drops blocks, least recently used first, and never a block an open episode pins while
//! anything else can go. Admission finds a prompt's blocks below the GPU by their
//! [`BlockKey`]s and loads them back when that is faster than recomputing them.
//!
//! Nothing here knows about models or tensors: blocks move through a [`BlockIo`] the engine
//! gives (bytes in, bytes out).
//!
//! Invariants: host bytes (blocks stored plus what swapped-out sequences reserve) never exceed
//! the host budget; a pinned block is dropped only when the lowest tier has no room for it.

use std::collections::HashMap;

use super::disk_tier::{DiskRead, DiskTier};
use super::disk_writer::DiskWriter;
use super::host_tier::{BlockData, HostTier};
use super::keys::{BlockKey, KeySeed};
pub use super::tier_types::{
    BlockIo, LoadPolicy, LoadTicket, Loaded, PendingFetch, Ticket, Tier, TierConfig, TierStats,
};
use crate::error::Result;

/// The host and disk tiers, the episodes' pins and the counters.
pub struct Tiers {
    io: Box<dyn BlockIo>,
    seed: KeySeed,
    layout: String,
    block_bytes: usize,
    host_budget: usize,
    host: HostTier,
    disk: Option<DiskTier>,
    /// The disk's writes, off the scheduler's thread (with the disk tier).
    writer: Option<DiskWriter>,
    pins: HashMap<BlockKey, u32>,
    pin_sets: HashMap<u64, Vec<BlockKey>>,
    /// Loads still copying (their tickets and bytes): the copy queue `worth_loading` weighs.
    copying: Vec<(LoadTicket, usize)>,
    /// Prefill tokens admitted and not computed yet (set by the scheduler each pass).
    prefill_queue: usize,
    /// A failed copy to host was logged (later ones are only counted).
    warned_copy: bool,
    load: LoadPolicy,
    stats: TierStats,
}

impl Tiers {
    /// Tiers as `cfg` says, moving blocks through `io`.
    pub fn new(cfg: TierConfig, io: Box<dyn BlockIo>) -> Self {
        let disk = cfg.disk.map(|(dir, cap)| DiskTier::open(&dir, cap));
        let writer = disk
            .as_ref()
            .filter(|d| d.enabled())
            .map(|d| DiskWriter::new(d.dir().to_path_buf()));
        Self {
            io,
            seed: KeySeed::new(&cfg.model, &cfg.layout, cfg.block_size),
            layout: cfg.layout,
            block_bytes: cfg.block_bytes,
            host_budget: cfg.host_bytes,
            host: HostTier::default(),
            disk,
            writer,
            pins: HashMap::new(),
            pin_sets: HashMap::new(),
            copying: Vec::new(),
            prefill_queue: 0,
            warned_copy: false,
            load: cfg.load,
            stats: TierStats::default(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> TierStats {
        let disk = self.disk.as_ref().filter(|d| d.enabled());
        TierStats {
            host_blocks: self.host.len(),
            host_bytes: self.host.bytes(),
            disk_blocks: disk.map_or(0, DiskTier::len),
            disk_bytes: disk.map_or(0, DiskTier::bytes),
            disk_on: disk.is_some(),
            pinned_blocks: self.pins.len(),
            measured_load_bytes_per_s: match self.load {
                LoadPolicy::Measured {
                    host_bytes_per_s, ..
                } => host_bytes_per_s,
                _ => 0.0,
            },
            measured_prefill_tokens_per_s: match self.load {
                LoadPolicy::Measured {
                    prefill_tokens_per_s,
                    ..
                } => prefill_tokens_per_s,
                _ => 0.0,
            },
            ..self.stats
        }
    }

    /// The host budget in bytes (blocks and swap together).
    pub fn host_budget(&self) -> usize {
        self.host_budget
    }

    /// The keys of `tokens`' whole blocks in namespace `ns`.
    pub fn keys(&self, ns: u64, tokens: &[u32]) -> Vec<BlockKey> {
        self.seed.chain(ns, tokens)
    }

    /// Starts the keys from other weights (`model`: their digest) after a weight update:
    /// blocks of the old weights are never found again. The host tier is emptied; the disk
    /// keeps its blocks (another process, or the old weights coming back, may use them).
    pub fn reseed(&mut self, model: &str) {
        self.seed = KeySeed::new(model, &self.layout, self.seed.block_size());
        self.host = HostTier::default();
    }

    /// Empties the host tier (a reset of the prefix cache).
    pub fn clear_host(&mut self) {
        self.host = HostTier::default();
    }

    /// Indexes the disk writes that finished since the last call.
    fn drain(&mut self) {
        if let (Some(w), Some(d)) = (&mut self.writer, &mut self.disk) {
            w.drain(d);
        }
    }

    /// Whether a tier below the GPU holds `k` (host memory, on its way to disk, or disk).
    fn below(&self, k: &BlockKey) -> Option<Tier> {
        if self.host.contains(k) || self.writer.as_ref().is_some_and(|w| w.contains(k)) {
            Some(Tier::Host)
        } else if self.disk.as_ref().is_some_and(|d| d.contains(k)) {
            Some(Tier::Disk)
        } else {
            None
        }
    }

    fn pinned(pins: &HashMap<BlockKey, u32>, k: &BlockKey) -> bool {
        pins.contains_key(k)
    }

    fn disk_on(&self) -> bool {
        self.disk.as_ref().is_some_and(DiskTier::enabled)
    }

    /// Moves one block to disk, making room there first (unpinned blocks first; a pinned one
    /// only when nothing else can go); counts it dropped if it does not fit.
    fn spill(&mut self, key: BlockKey, data: &BlockData) {
        let Some(disk) = self.disk.as_mut().filter(|d| d.enabled()) else {
            self.stats.dropped_blocks += 1;
            return;
        };
        let Some(writer) = self.writer.as_mut() else {
            self.stats.dropped_blocks += 1;
            return;
        };
        if disk.contains(&key) || writer.contains(&key) {
            return;
        }
        let pins = &self.pins;
        while !disk.room_with(writer.pending_bytes(), data.len()) {
            // Unpinned blocks go first; a pinned one only to make room for another pinned one.
            let dropped = disk.drop_lru(|k| Self::pinned(pins, k))
                || (Self::pinned(pins, &key) && disk.drop_lru(|_| false));
            if !dropped {
                break;
            }
            self.stats.dropped_blocks += 1;
        }
        if disk.room_with(writer.pending_bytes(), data.len())
            && writer.submit(key, data.clone(), disk, Self::pinned(pins, &key))
        {
            self.stats.spilled_blocks += 1;
        } else {
            self.stats.dropped_blocks += 1;
        }
    }

    /// Makes host room for `bytes` more with `reserved` bytes held by swapped-out sequences:
    /// least recently used blocks move to disk (or, without a disk tier, unpinned ones are
    /// dropped). False when the room cannot be made.
    pub fn make_host_room(&mut self, bytes: usize, reserved: usize) -> bool {
        while self.host.bytes() + reserved + bytes > self.host_budget {
            let pins = &self.pins;
            let popped = if self.disk_on() {
                // While the disk's writer is behind, a pinned block would wait for it (or be
                // dropped): unpinned ones go first, pinned ones only when nothing else can.
                let behind = self.writer.as_ref().is_some_and(DiskWriter::saturated);
                let first = self.host.pop_lru(|k| behind && Self::pinned(pins, k));
                first.or_else(|| self.host.pop_lru(|_| false))
            } else {
                self.host.pop_lru(|k| Self::pinned(pins, k))
            };
            let Some((key, data)) = popped else {
                return false;
            };
            self.spill(key, &data);
        }
        true
    }

    /// Copies the blocks of an evicted prefix-cache node to host: `tokens` run from its
    /// namespace's root to its end, `blocks` hold its last `blocks.len()` whole blocks. Blocks
    /// a lower tier already holds are not copied again. `reserved`: host bytes held by swap.
    pub fn demote(&mut self, ns: u64, tokens: &[u32], blocks: &[u32], reserved: usize) {
        self.drain();
        let keys = self.keys(ns, tokens);
        let first = keys.len().saturating_sub(blocks.len());
        let (todo_blocks, todo_keys): (Vec<u32>, Vec<BlockKey>) = blocks
            .iter()
            .zip(&keys[first..])
            .filter(|(_, k)| self.below(k).is_none())
            .map(|(b, k)| (*b, *k))
            .unzip();
        if todo_blocks.is_empty() {
            return;
        }
        // Room first: the copy takes a host buffer per block (on CUDA a slot of the pinned
        // pool, sized to the budget plus headroom), so the least recently used blocks move on
        // before the evicted ones are read. Read first, a burst larger than the free slots
        // failed whole: the newest blocks were dropped and the oldest stayed.
        let fit = (self.host_budget.saturating_sub(reserved) / self.block_bytes.max(1))
            .min(todo_blocks.len());
        self.make_host_room(fit * self.block_bytes, reserved);
        let data = match self.io.read(&todo_blocks) {
            Ok(d) => d,
            Err(e) => {
                if !self.warned_copy {
                    self.warned_copy = true;
                    tracing::warn!(error = %e, blocks = todo_blocks.len(), "copying evicted KV blocks to host failed; they are dropped (counted in dropped_blocks; warned once)");
                }
                self.stats.dropped_blocks += todo_blocks.len() as u64;
                return;
            }
        };
        for (key, data) in todo_keys.into_iter().zip(data) {
            self.stats.demoted_blocks += 1;
            if self.make_host_room(data.len(), reserved) {
                self.host.insert(key, data);
            } else {
                self.spill(key, &data);
            }
        }
    }

    /// Finds the blocks of `tokens` (namespace `ns`) below the GPU from block `from` on, in
    /// order, stopping at the first block no tier holds.
    pub fn probe(&mut self, ns: u64, tokens: &[u32], from: usize) -> Vec<(BlockKey, Tier)> {
        self.drain();
        let queued = self.writer.as_ref().is_some_and(|w| w.pending_bytes() > 0);
        if self.host.is_empty() && !queued && self.disk.as_ref().is_none_or(DiskTier::is_empty) {
            return vec![];
        }
        self.keys(ns, tokens)
            .into_iter()
            .skip(from)
            .map_while(|k| self.below(&k).map(|t| (k, t)))
            .collect()
    }

    /// Whether loading the `found` blocks beats recomputing them (counted when it does not).
    /// `rest`: the tokens the request computes anyway (its prompt past `found`), queued for
    /// prefill either way.
    pub fn worth_loading(
        &mut self,
        found: &[(BlockKey, Tier)],
        block_size: usize,
        rest: usize,
    ) -> bool {
        let host = found.iter().filter(|(_, t)| *t == Tier::Host).count();
        let disk = found.len() - host;
        self.copying.retain(|(t, _)| !t.0.done());
        let queued = self.copying.iter().map(|(_, b)| b).sum::<usize>();
        let tokens = found.len() * block_size;
        let yes = self.load.should_load(
            (host * self.block_bytes, disk * self.block_bytes, tokens),
            (queued, self.prefill_queue),
        );
        self.prefill_queue += rest + if yes { 0 } else { tokens };
        if !yes {
            self.stats.recomputes_chosen += found.len() as u64;
        }
        yes
    }

    /// The prefill tokens admitted and not computed yet, before an admission pass.
    pub fn set_prefill_queue(&mut self, tokens: usize) {
        self.prefill_queue = tokens;
    }

    /// Reads the `found` blocks' bytes, in order, stopping at the first that is gone or fails
    /// its checksum (counted; the rest is recomputed). Disk blocks read are not kept on host
    /// (that would push other blocks down to disk in their place); once loaded they are the
    /// GPU's, and the disk keeps its copy.
    pub fn fetch(&mut self, found: &[(BlockKey, Tier)]) -> Loaded {
        let pending = self.start_fetch(found, false);
        self.finish_fetch(pending)
    }

    /// [`Tiers::fetch`] in two halves: the blocks host memory holds (or the disk writer still
    /// has) are taken now, the disk's files of the others are read on the disk-read threads
    /// ([`super::io_pool`]): with `background`, once the caller starts them
    /// ([`PendingFetch::launch`]) and while it goes on; else before this returns.
    /// [`Tiers::finish_fetch`] gives the blocks.
    pub fn start_fetch(&mut self, found: &[(BlockKey, Tier)], background: bool) -> PendingFetch {
        let held: Vec<Option<BlockData>> = found
            .iter()
            .map(|(key, _)| {
                self.host
                    .get(key)
                    .or_else(|| self.writer.as_ref().and_then(|w| w.get(key)))
            })
            .collect();
        let on_disk: Vec<BlockKey> = found
            .iter()
            .zip(&held)
            .filter(|(_, h)| h.is_none())
            .map(|((key, _), _)| *key)
            .collect();
        let job = match self.disk.as_ref() {
            Some(disk) if !on_disk.is_empty() => Some(disk.plan_reads(&on_disk, self.block_bytes)),
            _ => None,
        };
        let mut pending = PendingFetch {
            keys: found.iter().map(|(k, _)| *k).collect(),
            held,
            job,
            reads: None,
        };
        if !background {
            pending.launch(false);
        }
        pending
    }

    /// The blocks of a fetch [`Tiers::start_fetch`] began (waiting for its disk reads), in
    /// order, up to the first that is gone or fails its checksum (counted).
    pub fn finish_fetch(&mut self, mut pending: PendingFetch) -> Loaded {
        pending.launch(false);
        let PendingFetch {
            keys, held, reads, ..
        } = pending;
        let read = match (reads, self.disk.as_mut()) {
            (Some(slot), Some(disk)) => slot.take().map_or_else(Vec::new, |r| disk.settle_reads(r)),
            _ => Vec::new(),
        };
        let mut read = read.into_iter();
        let mut out = Loaded::default();
        for (key, h) in keys.iter().zip(held) {
            if let Some(d) = h {
                out.data.push(d);
                out.from_host += 1;
                continue;
            }
            match read.next() {
                Some(DiskRead::Ok(v)) => {
                    out.data.push(std::sync::Arc::new(v));
                    out.from_disk += 1;
                }
                Some(DiskRead::Missing) => {
                    self.stats.missing_blocks += 1;
                    break;
                }
                Some(DiskRead::Corrupt) => {
                    self.stats.checksum_failures += 1;
                    tracing::warn!(key = %key.hex(), "a disk KV block failed its checksum; recomputing it");
                    break;
                }
                // No disk tier: the block is gone.
                None => break,
            }
        }
        out
    }

    /// Copies fetched blocks into device `blocks` (as many as `loaded` has); counts the loads.
    /// Returns the ticket of a copy still running.
    pub fn upload(&mut self, blocks: &[u32], loaded: &Loaded) -> Result<Option<LoadTicket>> {
        let ticket = self.io.write(blocks, &loaded.data)?;
        if let Some(t) = &ticket {
            self.copying
                .push((t.clone(), loaded.data.len() * self.block_bytes));
        }
        self.stats.host_loads += loaded.from_host as u64;
        self.stats.disk_loads += loaded.from_disk as u64;
        self.stats.load_bytes += loaded.data.iter().map(|d| d.len() as u64).sum::<u64>();
        Ok(ticket)
    }

    /// Pins the whole blocks of `tokens` (namespace `ns`) for an open episode: they may move
    /// down tiers but the lowest tier drops them only when it has no room for anything else.
    /// `id` names the pin for [`Tiers::unpin`] (pinning under an id in use replaces that pin).
    pub fn pin(&mut self, id: u64, ns: u64, tokens: &[u32]) {
        self.unpin(id);
        let keys = self.keys(ns, tokens);
        for k in &keys {
            *self.pins.entry(*k).or_insert(0) += 1;
        }
        self.pin_sets.insert(id, keys);
    }

    /// Releases a pin (unknown ids are ignored: a pin is released once).
    pub fn unpin(&mut self, id: u64) {
        for k in self.pin_sets.remove(&id).unwrap_or_default() {
            if let Some(n) = self.pins.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.pins.remove(&k);
                }
            }
        }
    }
}

impl std::fmt::Debug for Tiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiers")
            .field("host_budget", &self.host_budget)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
