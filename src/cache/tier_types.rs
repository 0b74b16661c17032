//! The data of the KV tiers below the GPU: what moves blocks ([`BlockIo`], its [`Ticket`]s),
//! when a load beats a recompute ([`LoadPolicy`]), the set-up ([`TierConfig`]) and the counters
//! ([`TierStats`]). The behaviour is `tiers.rs`'s.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use serde::Serialize;

use super::disk_tier::{DiskReads, ReadFiles, io_pool};
use super::host_tier::BlockData;
use super::keys::BlockKey;
use crate::error::Result;

/// A load on its way to the device ([`BlockIo::write`] on a copy stream of its own): the
/// sequence it is for waits until it is done; nobody else does.
pub trait Ticket: Send + Sync {
    /// Whether the blocks are in the cache (a poll; never waits).
    fn done(&self) -> bool;
    /// Waits until they are.
    fn wait(&self);
    /// Once done: whether the copy succeeded (when not, the blocks hold garbage and the
    /// sequence recomputes them).
    fn ok(&self) -> bool {
        true
    }
}

/// A shared [`Ticket`].
#[derive(Clone)]
pub struct LoadTicket(pub std::sync::Arc<dyn Ticket>);

impl std::fmt::Debug for LoadTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadTicket")
            .field("done", &self.0.done())
            .finish()
    }
}

/// Moves blocks of KV between the device's cache and host bytes (one `Vec<u8>` per block, the
/// same layout both ways).
pub trait BlockIo: Send {
    /// The KV of `blocks`, one buffer per block (the copy may still be running: a buffer's
    /// [`HostBuf::bytes`](super::HostBuf::bytes) waits for it).
    fn read(&self, blocks: &[u32]) -> Result<Vec<BlockData>>;
    /// Writes buffers read by [`BlockIo::read`] into `blocks`: done on return (`None`), or a
    /// ticket to wait on before anything reads those blocks.
    fn write(&self, blocks: &[u32], data: &[BlockData]) -> Result<Option<LoadTicket>>;
}

/// When admission loads a prompt's blocks from host or disk rather than recomputing them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadPolicy {
    /// Always load (tests; a device whose prefill is known to be slower than its copies).
    Always,
    /// Never load: recompute (tiers keep blocks, e.g. across a restart, but serve none).
    Never,
    /// Load when the copy time at the measured rates beats recomputing at the measured
    /// prefill rate.
    Measured {
        /// Host-to-device bytes per second.
        host_bytes_per_s: f64,
        /// Disk-to-device bytes per second (read and verify, then copy).
        disk_bytes_per_s: f64,
        /// Prefill tokens per second.
        prefill_tokens_per_s: f64,
    },
}

impl LoadPolicy {
    /// Whether loading `host_bytes` from host and `disk_bytes` from disk beats recomputing
    /// `tokens` tokens, each behind its queue: `queued_bytes` of loads still copying (one copy
    /// engine serves them in order) and `queued_tokens` of prefill already admitted (the SMs).
    /// When many episodes resume at once the copies queue up; past the point where the copy
    /// queue would finish later than the prefill queue, recomputing is faster.
    pub fn should_load(
        &self,
        (host_bytes, disk_bytes, tokens): (usize, usize, usize),
        (queued_bytes, queued_tokens): (usize, usize),
    ) -> bool {
        match *self {
            LoadPolicy::Always => true,
            LoadPolicy::Never => false,
            LoadPolicy::Measured {
                host_bytes_per_s,
                disk_bytes_per_s,
                prefill_tokens_per_s,
            } => {
                let load = (queued_bytes + host_bytes) as f64 / host_bytes_per_s.max(1.0)
                    + disk_bytes as f64 / disk_bytes_per_s.max(1.0);
                load < (queued_tokens + tokens) as f64 / prefill_tokens_per_s.max(1.0)
            }
        }
    }
}

/// How the tiers are set up.
#[derive(Debug, Clone)]
pub struct TierConfig {
    /// Host bytes for blocks and swapped-out sequences together.
    pub host_bytes: usize,
    /// The disk tier's directory and cap in bytes (`None`: no disk tier).
    pub disk: Option<(PathBuf, usize)>,
    /// When to load rather than recompute.
    pub load: LoadPolicy,
    /// The weights' content digest (block keys start from it).
    pub model: String,
    /// The KV's form (dtype, layers, heads, head dim): blocks of another layout never match.
    pub layout: String,
    /// Tokens per block.
    pub block_size: usize,
    /// Bytes of one block's KV.
    pub block_bytes: usize,
}

/// Counters of the tiers below the GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TierStats {
    /// Blocks in host memory now.
    pub host_blocks: usize,
    /// Bytes of those blocks.
    pub host_bytes: usize,
    /// Blocks on disk now.
    pub disk_blocks: usize,
    /// Bytes of those blocks.
    pub disk_bytes: usize,
    /// Whether the disk tier is on (configured, and no error turned it off).
    pub disk_on: bool,
    /// Blocks copied from the GPU to host on eviction.
    pub demoted_blocks: u64,
    /// Blocks moved from host to disk.
    pub spilled_blocks: u64,
    /// Blocks dropped from the lowest tier.
    pub dropped_blocks: u64,
    /// Blocks loaded back to the GPU from host.
    pub host_loads: u64,
    /// Blocks loaded back to the GPU from disk.
    pub disk_loads: u64,
    /// Bytes loaded back to the GPU.
    pub load_bytes: u64,
    /// Blocks found below the GPU but recomputed, because loading them was slower.
    pub recomputes_chosen: u64,
    /// Disk blocks that failed their checksum or were truncated (recomputed instead).
    pub checksum_failures: u64,
    /// Disk blocks indexed but whose file was gone (recomputed instead).
    pub missing_blocks: u64,
    /// Blocks pinned by open episodes now.
    pub pinned_blocks: usize,
    /// The host-to-device rate measured at start-up (bytes/s; 0: not measured).
    pub measured_load_bytes_per_s: f64,
    /// The prefill rate measured at start-up (tokens/s; 0: not measured).
    pub measured_prefill_tokens_per_s: f64,
}

/// Where a block below the GPU was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Host memory.
    Host,
    /// Local disk.
    Disk,
}

/// Blocks found below the GPU for a prompt, in order, ready to copy to the device.
#[derive(Default)]
pub struct Loaded {
    /// The blocks' bytes.
    pub data: Vec<BlockData>,
    /// How many of them came from host.
    pub from_host: usize,
    /// How many of them came from disk.
    pub from_disk: usize,
}

/// A fetch ([`Tiers::start_fetch`](super::Tiers::start_fetch)) whose disk files are to be
/// read, are being read or were read; finished by
/// [`Tiers::finish_fetch`](super::Tiers::finish_fetch) on the tiers' owner.
#[derive(Clone)]
pub struct PendingFetch {
    pub(super) keys: Vec<BlockKey>,
    /// Each block's bytes where host memory (or the disk writer) had them.
    pub(super) held: Vec<Option<BlockData>>,
    /// The disk reads of the others, not started yet.
    pub(super) job: Option<DiskReads>,
    /// The disk reads started (`None`: none started, or none to read).
    pub(super) reads: Option<Arc<ReadSlot>>,
}

impl PendingFetch {
    /// Starts its disk reads on the disk-read threads ([`io_pool`]), in the background when
    /// `background` (else they are done on return); nothing if they started already.
    pub fn launch(&mut self, background: bool) {
        let Some(job) = self.job.take() else {
            return;
        };
        let slot = Arc::new(ReadSlot::default());
        match io_pool() {
            Some(pool) if background => {
                let filled = slot.clone();
                pool.spawn(move || filled.fill(job.run()));
            }
            _ => slot.fill(job.read_now()),
        }
        self.reads = Some(slot);
    }

    /// Whether nothing is left to wait for: its disk reads are done, or were never started
    /// (then [`Tiers::finish_fetch`](super::Tiers::finish_fetch) does them itself). A poll;
    /// never waits.
    pub fn done(&self) -> bool {
        self.reads.as_ref().is_none_or(|s| s.done())
    }

    /// Waits until its started disk reads are done.
    pub fn wait(&self) {
        if let Some(s) = &self.reads {
            s.wait();
        }
    }

    /// Whether it reads anything from disk.
    pub fn reads_disk(&self) -> bool {
        self.job.is_some() || self.reads.is_some()
    }

    /// Blocks it fetches at most: from host memory, from disk.
    pub fn planned(&self) -> (usize, usize) {
        let host = self.held.iter().filter(|h| h.is_some()).count();
        (host, self.held.len() - host)
    }
}

impl std::fmt::Debug for PendingFetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFetch")
            .field("blocks", &self.keys.len())
            .field("done", &self.done())
            .finish()
    }
}

/// Where a disk-read job leaves its results.
#[derive(Default)]
pub(super) struct ReadSlot {
    /// The results; `taken` once settled.
    files: Mutex<Option<ReadFiles>>,
    filled: std::sync::atomic::AtomicBool,
    ready: Condvar,
}

impl ReadSlot {
    pub(super) fn fill(&self, r: ReadFiles) {
        let mut g = self.files.lock();
        *g = Some(r);
        // Under the lock: a waiter checks the flag and sleeps holding it, so it cannot miss
        // the notification below.
        self.filled
            .store(true, std::sync::atomic::Ordering::Release);
        drop(g);
        self.ready.notify_all();
    }

    fn done(&self) -> bool {
        self.filled.load(std::sync::atomic::Ordering::Acquire)
    }

    fn wait(&self) {
        let mut g = self.files.lock();
        while !self.done() {
            self.ready.wait(&mut g);
        }
    }

    /// The results, once (waiting for them).
    pub(super) fn take(&self) -> Option<ReadFiles> {
        self.wait();
        self.files.lock().take()
    }
}
