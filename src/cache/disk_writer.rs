//! `DiskWriter`: the disk tier's writes on a thread of their own, so that moving blocks from
//! host to disk (checksums and file writes, and on CUDA waiting for a block's copy from the
//! device) never stalls the scheduler. Blocks on their way stay readable from memory until
//! their file is indexed.
//!
//! Invariants: a block is in `pending` from submission until its result is drained; dropping
//! the writer waits for every queued write (a restarted engine finds all of them).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::disk_tier::{DiskTier, write_file};
use super::host_tier::BlockData;
use super::keys::BlockKey;

/// Most blocks queued for writing (1024 blocks of the 1.7B: 1.9 GB) before the writer counts
/// as behind: unpinned blocks are then dropped, pinned ones wait.
const MAX_PENDING: usize = 1024;

/// The most blocks the writer queues (for those who size host memory around the queue).
pub const DISK_QUEUE_BLOCKS: usize = MAX_PENDING;

type Done = (BlockKey, usize, std::io::Result<()>);

/// The disk tier's writer thread and the blocks on their way to it.
pub struct DiskWriter {
    tx: Option<mpsc::Sender<(BlockKey, BlockData)>>,
    rx: mpsc::Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    pending: HashMap<BlockKey, BlockData>,
    pending_bytes: usize,
}

impl DiskWriter {
    /// A writer of block files under `dir`.
    pub fn new(dir: PathBuf) -> Self {
        let (tx, jobs) = mpsc::channel::<(BlockKey, BlockData)>();
        let (done, rx) = mpsc::channel::<Done>();
        let thread = std::thread::Builder::new()
            .name("kv-disk-writer".into())
            .spawn(move || {
                for (key, data) in jobs {
                    let r = write_file(&dir, key, data.bytes());
                    if done.send((key, data.len(), r)).is_err() {
                        break;
                    }
                }
            })
            .ok();
        Self {
            tx: Some(tx),
            rx,
            thread,
            pending: HashMap::new(),
            pending_bytes: 0,
        }
    }

    /// Whether the queue is full (a submission would drop or wait).
    pub fn saturated(&self) -> bool {
        self.pending.len() >= MAX_PENDING
    }

    /// Bytes queued and not yet indexed.
    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes
    }

    /// A block on its way to disk.
    pub fn get(&self, key: &BlockKey) -> Option<BlockData> {
        self.pending.get(key).cloned()
    }

    /// Whether a block is on its way.
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.pending.contains_key(key)
    }

    /// Queues a block; false when it was not queued: the thread is gone, or too many blocks
    /// are queued and `wait` is false (the disk cannot keep up: the block is dropped rather
    /// than the scheduler waiting; pinned blocks wait).
    pub fn submit(
        &mut self,
        key: BlockKey,
        data: BlockData,
        disk: &mut DiskTier,
        wait: bool,
    ) -> bool {
        self.drain(disk);
        if self.pending.len() >= MAX_PENDING && !wait {
            return false;
        }
        while self.pending.len() >= MAX_PENDING {
            match self.rx.recv() {
                Ok(d) => self.finish(d, disk),
                Err(_) => return false,
            }
        }
        let Some(tx) = &self.tx else { return false };
        if tx.send((key, data.clone())).is_err() {
            return false;
        }
        self.pending_bytes += data.len();
        self.pending.insert(key, data);
        true
    }

    /// Indexes the blocks written since the last call (an error turns the tier off).
    pub fn drain(&mut self, disk: &mut DiskTier) {
        while let Ok(d) = self.rx.try_recv() {
            self.finish(d, disk);
        }
    }

    fn finish(&mut self, (key, len, r): Done, disk: &mut DiskTier) {
        if let Some(d) = self.pending.remove(&key) {
            self.pending_bytes -= d.len();
        }
        match r {
            Ok(()) => disk.record(key, len),
            Err(e) => disk.fail(&e),
        }
    }
}

impl Drop for DiskWriter {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
