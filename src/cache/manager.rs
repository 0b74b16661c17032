//! `KvManager`: the one type the scheduler talks to about KV memory. It owns the block pool,
//! the radix prefix cache (optional) and the swap accounting; it knows nothing of models,
//! tensors or requests, so it is tested without a model.
//!
//! Invariants: every block a sequence holds is one pool reference, given back exactly once
//! (`release`, `release_uncached` or `swap_out`); the radix tree holds its own references; a
//! prefix lookup is counted in the cache statistics only when its request is admitted; swap
//! bytes in use never exceed the budget.

use serde::Serialize;

use super::tiers::{LoadTicket, PendingFetch, TierStats, Tiers};
use super::{BlockPool, CacheStats, RadixCache};

/// What a sequence holds after admission.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// Its blocks: the cached prefix's first, then fresh ones.
    pub blocks: Vec<u32>,
    /// Tokens whose KV is already in `blocks` (from the prefix cache).
    pub cached_tokens: usize,
    /// The pinned radix node of the cached prefix (give it back through `release`).
    pub pin: Option<usize>,
    /// Of `cached_tokens`, those loaded back from host memory.
    pub host_tokens: usize,
    /// Of `cached_tokens`, those loaded back from disk.
    pub disk_tokens: usize,
    /// The copy of loaded blocks still running: the sequence must not run before it is done.
    pub loading: Option<LoadTicket>,
    /// Blocks still being read from disk ([`KvManager::admit_with`]): the sequence must
    /// not run before [`KvManager::finish_read`] took them; `cached_tokens` and the tier
    /// counts above assume every block comes.
    pub reading: Option<PendingRead>,
}

/// An admission's blocks on their way from disk ([`Admitted::reading`]).
#[derive(Debug, Clone)]
pub struct PendingRead {
    fetch: PendingFetch,
    /// The device blocks the fetched blocks go to, in order.
    blocks: Vec<u32>,
}

impl PendingRead {
    /// Whether the reads are done (a poll; never waits).
    pub fn done(&self) -> bool {
        self.fetch.done()
    }

    /// Waits until the reads are done.
    pub fn wait(&self) {
        self.fetch.wait();
    }

    /// Blocks it loads at most.
    pub fn planned(&self) -> usize {
        self.blocks.len()
    }
}

/// What a finished [`PendingRead`] loaded ([`KvManager::finish_read`]).
#[derive(Debug, Default)]
pub struct ReadDone {
    /// Blocks loaded (from the first of the read on; the rest is recomputed).
    pub blocks: usize,
    /// Of those, from host memory.
    pub from_host: usize,
    /// Of those, from disk.
    pub from_disk: usize,
    /// Their copy to the device, still running.
    pub loading: Option<LoadTicket>,
}

/// Counters of the KV memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct KvStats {
    /// Blocks in total.
    pub blocks_total: usize,
    /// Blocks free now.
    pub blocks_free: usize,
    /// The prefix cache's counters (None when it is off).
    pub cache: Option<CacheStats>,
    /// Host bytes holding swapped-out KV now.
    pub swap_used_bytes: usize,
    /// The tiers below the GPU (None when they are off).
    pub tiers: Option<TierStats>,
}

/// Block pool + prefix cache + swap accounting.
#[derive(Debug)]
pub struct KvManager {
    pool: BlockPool,
    radix: Option<RadixCache>,
    block_size: usize,
    block_bytes: usize,
    swap_budget: usize,
    swap_used: usize,
    tiers: Option<Tiers>,
}

impl KvManager {
    /// `num_blocks` blocks of `block_size` tokens, each `block_bytes` of KV; a prefix cache when
    /// `prefix_cache`; up to `swap_budget` host bytes for swapped-out KV (0: no swap).
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        block_bytes: usize,
        prefix_cache: bool,
        swap_budget: usize,
    ) -> Self {
        let block_size = block_size.max(1);
        Self {
            pool: BlockPool::new(num_blocks),
            radix: prefix_cache.then(|| RadixCache::new(block_size)),
            block_size,
            block_bytes,
            swap_budget,
            swap_used: 0,
            tiers: None,
        }
    }

    /// Adds the KV tiers below the GPU (they need the prefix cache: without it they are
    /// dropped). Their host budget replaces the swap budget: swapped-out sequences and host
    /// blocks share one pool.
    pub fn set_tiers(&mut self, tiers: Tiers) {
        if self.radix.is_some() {
            self.swap_budget = tiers.host_budget();
            self.tiers = Some(tiers);
        }
    }

    /// The tiers below the GPU, if on.
    pub fn tiers_mut(&mut self) -> Option<&mut Tiers> {
        self.tiers.as_mut()
    }

    /// Pins the whole blocks of `tokens` (namespace `ns`) in the tiers below the GPU for an
    /// open episode, under `id` (nothing when the tiers are off).
    pub fn pin(&mut self, id: u64, ns: u64, tokens: &[u32]) {
        if let Some(t) = &mut self.tiers {
            t.pin(id, ns, tokens);
        }
    }

    /// Releases a pin of [`KvManager::pin`].
    pub fn unpin(&mut self, id: u64) {
        if let Some(t) = &mut self.tiers {
            t.unpin(id);
        }
    }

    /// Drops every cached prefix no running sequence pins (their blocks go back to the free
    /// list); returns how many blocks were freed. Nothing without a prefix cache.
    pub fn reset_prefix_cache(&mut self) -> usize {
        if let Some(t) = &mut self.tiers {
            t.clear_host();
        }
        match &mut self.radix {
            Some(r) => r.evict(usize::MAX, &mut self.pool).unwrap_or(0),
            None => 0,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in total.
    pub fn capacity(&self) -> usize {
        self.pool.capacity()
    }

    /// Blocks free now (cached-but-unpinned blocks are not free until evicted).
    pub fn num_free(&self) -> usize {
        self.pool.num_free()
    }

    /// Blocks that hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Whether the prefix cache is on.
    pub fn prefix_cache(&self) -> bool {
        self.radix.is_some()
    }

    /// Whether swapping out is possible at all.
    pub fn can_swap(&self) -> bool {
        self.swap_budget > 0
    }

    /// Counters.
    pub fn stats(&self) -> KvStats {
        KvStats {
            blocks_total: self.pool.capacity(),
            blocks_free: self.pool.num_free(),
            cache: self.radix.as_ref().map(RadixCache::stats),
            swap_used_bytes: self.swap_used,
            tiers: self.tiers.as_ref().map(Tiers::stats),
        }
    }

    /// Takes `n` free blocks (one reference each), evicting unpinned cached prefixes if needed;
    /// `None` (taking nothing) when even eviction cannot free enough.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.pool.num_free()
            && let Some(r) = &mut self.radix
        {
            let short = n - self.pool.num_free();
            let (tiers, reserved) = (&mut self.tiers, self.swap_used);
            let mut sink = |ev: super::radix::Evicted<'_>| {
                if let Some(t) = tiers.as_mut() {
                    t.demote(ev.ns, ev.tokens, ev.blocks, reserved);
                }
            };
            if let Err(e) = r.evict_with(short, &mut self.pool, &mut sink) {
                tracing::error!(error = %e, "block accounting error while evicting");
            }
        }
        self.pool.allocate(n)
    }

    /// Admits a sequence of `tokens`, needing blocks for `total_tokens`: reuses the longest
    /// cached prefix of `tokens` and allocates the rest. `defer(cached_tokens)` may still say
    /// no (e.g. the rest of the prefix is being computed by another request). All or nothing:
    /// `None` leaves the memory and the counters as they were.
    pub fn admit(
        &mut self,
        tokens: &[u32],
        total_tokens: usize,
        defer: impl FnOnce(usize) -> bool,
    ) -> Option<Admitted> {
        self.admit_in(0, tokens, total_tokens, defer)
    }

    /// [`KvManager::admit`] with the prefix looked up in namespace `ns` of the prefix cache
    /// (one per LoRA adapter content; 0: the base weights).
    pub fn admit_in(
        &mut self,
        ns: u64,
        tokens: &[u32],
        total_tokens: usize,
        defer: impl FnOnce(usize) -> bool,
    ) -> Option<Admitted> {
        self.admit_with(ns, tokens, total_tokens, defer, false)
    }

    /// The blocks a [`PendingRead`] brought (waiting for its reads), copied into its device
    /// blocks: how many, and the copy's ticket. Fewer than planned when a file was gone or
    /// failed its checksum (counted): the sequence recomputes from there.
    pub fn finish_read(&mut self, r: PendingRead) -> ReadDone {
        let Some(t) = &mut self.tiers else {
            return ReadDone::default();
        };
        let loaded = t.finish_fetch(r.fetch);
        if loaded.data.is_empty() {
            return ReadDone::default();
        }
        match t.upload(&r.blocks[..loaded.data.len()], &loaded) {
            Ok(loading) => ReadDone {
                blocks: loaded.data.len(),
                from_host: loaded.from_host,
                from_disk: loaded.from_disk,
                loading,
            },
            Err(e) => {
                tracing::warn!(error = %e, "loading KV blocks back to the device failed; recomputing them");
                ReadDone::default()
            }
        }
    }

    /// [`KvManager::admit_in`]; with `background`, the blocks a tier holds on disk are read
    /// off the caller's thread ([`Admitted::reading`]): the caller keeps its sequence from
    /// running until [`KvManager::finish_read`] took them, and nobody else waits for the disk.
    pub fn admit_with(
        &mut self,
        ns: u64,
        tokens: &[u32],
        total_tokens: usize,
        defer: impl FnOnce(usize) -> bool,
        background: bool,
    ) -> Option<Admitted> {
        let hit = self.radix.as_mut().map(|r| r.lookup_in(ns, tokens));
        let (cached, gpu_tokens) = hit
            .as_ref()
            .map(|m| (m.blocks.clone(), m.tokens))
            .unwrap_or_default();
        // The blocks after the GPU's prefix that a tier below holds, when loading them pays.
        let bs = self.block_size;
        let found = match &mut self.tiers {
            Some(t) => {
                let f = t.probe(ns, tokens, cached.len());
                let rest = tokens.len().saturating_sub((cached.len() + f.len()) * bs);
                if !f.is_empty() && t.worth_loading(&f, bs, rest) {
                    f
                } else {
                    vec![]
                }
            }
            None => vec![],
        };
        let need = self.blocks_for(total_tokens).saturating_sub(cached.len());
        let give_up = |me: &mut Self| {
            if let (Some(r), Some(m)) = (&mut me.radix, &hit) {
                r.release(m.node);
            }
            None
        };
        if defer(gpu_tokens + found.len() * bs) {
            return give_up(self);
        }
        // Read before allocating: the allocation may evict, and so move blocks between tiers
        // (a disk file read in the background that eviction removes reads as gone).
        let pending = match &mut self.tiers {
            Some(t) if !found.is_empty() => Some(t.start_fetch(&found, background)),
            _ => None,
        };
        let Some(fresh) = self.allocate(need) else {
            return give_up(self);
        };
        let mut pending = match pending {
            Some(p) if background && p.reads_disk() => p,
            other => {
                return self.admit_loaded(ns, tokens, (hit, cached, gpu_tokens), other, fresh);
            }
        };
        // The disk reads go on (started only now that the blocks they go to are there): the
        // sequence waits for them, not the caller.
        pending.launch(true);
        let (host, disk) = pending.planned();
        if let Err(e) = self.pool.retain(&cached) {
            tracing::error!(error = %e, "block accounting error while reusing a prefix");
        }
        let cached_tokens = gpu_tokens + found.len() * bs;
        if let Some(r) = &mut self.radix {
            r.record_lookup(tokens.len(), cached_tokens);
        }
        let reading = PendingRead {
            fetch: pending,
            blocks: fresh[..found.len()].to_vec(),
        };
        let mut blocks = cached;
        blocks.extend(fresh);
        Some(Admitted {
            blocks,
            cached_tokens,
            pin: hit.map(|m| m.node),
            host_tokens: host * bs,
            disk_tokens: disk * bs,
            loading: None,
            reading: Some(reading),
        })
    }

    /// The end of an admission that waits for its loaded blocks' reads (`pending`: a fetch
    /// whose disk reads, if any, ran or run now): copies them into `fresh`
    /// ([`KvManager::finish_read`]), publishes them when the copy is done.
    fn admit_loaded(
        &mut self,
        ns: u64,
        tokens: &[u32],
        (hit, cached, gpu_tokens): (Option<super::radix_types::PrefixMatch>, Vec<u32>, usize),
        pending: Option<PendingFetch>,
        fresh: Vec<u32>,
    ) -> Option<Admitted> {
        let bs = self.block_size;
        let done = match pending {
            Some(fetch) => {
                let (host, disk) = fetch.planned();
                self.finish_read(PendingRead {
                    blocks: fresh[..host + disk].to_vec(),
                    fetch,
                })
            }
            None => ReadDone::default(),
        };
        if let Err(e) = self.pool.retain(&cached) {
            tracing::error!(error = %e, "block accounting error while reusing a prefix");
        }
        let below = done.blocks;
        let cached_tokens = gpu_tokens + below * bs;
        if let Some(r) = &mut self.radix {
            r.record_lookup(tokens.len(), cached_tokens);
        }
        let mut blocks = cached;
        let gpu_blocks = blocks.len();
        blocks.extend(fresh);
        if below > 0 && done.loading.is_none() {
            // Loaded blocks are the GPU's again: other requests find them there. (A load still
            // copying is published by its owner once done: nobody may read them before.)
            self.publish_in(ns, &tokens[..cached_tokens], &blocks[..gpu_blocks + below]);
        }
        Some(Admitted {
            blocks,
            cached_tokens,
            pin: hit.map(|m| m.node),
            host_tokens: done.from_host * bs,
            disk_tokens: done.from_disk * bs,
            loading: done.loading,
            reading: None,
        })
    }

    /// Publishes the KV of `tokens` (held in `blocks`) to the prefix cache, so that other
    /// requests reuse it while its owner still runs.
    pub fn publish(&mut self, tokens: &[u32], blocks: &[u32]) {
        self.publish_in(0, tokens, blocks);
    }

    /// [`KvManager::publish`] into namespace `ns` of the prefix cache.
    pub fn publish_in(&mut self, ns: u64, tokens: &[u32], blocks: &[u32]) {
        if let Some(r) = &mut self.radix
            && let Err(e) = r.insert_in(ns, tokens, blocks, &mut self.pool)
        {
            tracing::error!(error = %e, "block accounting error while caching a prefix");
        }
    }

    /// A leaving sequence: its computed `tokens` go into the prefix cache, then its pin and
    /// its block references are dropped.
    pub fn release(&mut self, tokens: &[u32], blocks: &[u32], pin: Option<usize>) {
        self.release_in(0, tokens, blocks, pin);
    }

    /// [`KvManager::release`] into namespace `ns` of the prefix cache.
    pub fn release_in(&mut self, ns: u64, tokens: &[u32], blocks: &[u32], pin: Option<usize>) {
        self.publish_in(ns, tokens, blocks);
        self.release_uncached(blocks, pin);
    }

    /// A leaving sequence whose KV must not be cached (failed mid-write, or swapped out).
    pub fn release_uncached(&mut self, blocks: &[u32], pin: Option<usize>) {
        if let (Some(r), Some(node)) = (&mut self.radix, pin) {
            r.release(node);
        }
        if let Err(e) = self.pool.release(blocks) {
            tracing::error!(error = %e, "block accounting error while releasing blocks");
        }
    }

    /// Reserves host memory for the KV of `blocks` blocks; false when the budget is short.
    pub fn reserve_swap(&mut self, blocks: usize) -> bool {
        let bytes = blocks * self.block_bytes;
        if let Some(t) = &mut self.tiers
            && !t.make_host_room(bytes, self.swap_used)
        {
            return false;
        }
        if self.swap_budget == 0 || self.swap_used + bytes > self.swap_budget {
            return false;
        }
        self.swap_used += bytes;
        true
    }

    /// Gives back host memory reserved for `blocks` blocks (swap-in done, or swap-out failed).
    pub fn unreserve_swap(&mut self, blocks: usize) {
        self.swap_used = self.swap_used.saturating_sub(blocks * self.block_bytes);
    }
}
