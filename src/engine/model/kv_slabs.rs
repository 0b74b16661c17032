//! Pinned host memory for the KV tiers on CUDA: slabs pinned at start-up, cut into block-sized
//! slots ([`Slabs`]), and one block's bytes in a slot ([`PinnedBlock`]), the host buffer that
//! `super::kv_pinned::PinnedKvIo` copies to and from the device.
//!
//! Invariant: a slot is on the free list or owned by exactly one `PinnedBlock`; slabs are freed
//! only when the `Slabs` drop (after both streams are idle).

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaEvent, CudaStream, result};
use parking_lot::Mutex;

use crate::cache::{BlockData, HostBuf};
use crate::error::{Error, Result};

/// Blocks per pinned slab (one `cuMemHostAlloc`).
const SLAB_BLOCKS: usize = 128;

pub(super) fn cuda_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Engine(format!("KV tier copy: {what}: {e}"))
}

/// Pinned slabs cut into block-sized slots. All are pinned at start-up: afterwards a move that
/// finds no free slot fails (its blocks are dropped, or recomputed) rather than pinning more,
/// which would stall every step behind the driver (BENCHMARKS.md).
pub(super) struct Slabs {
    /// Bytes of one slot (one KV block).
    pub(super) block_bytes: usize,
    state: Mutex<SlabState>,
}

#[derive(Default)]
struct SlabState {
    /// Base addresses of the slabs (freed on drop).
    slabs: Vec<usize>,
    /// Free slot addresses.
    free: Vec<usize>,
}

impl Slabs {
    /// No slab yet: [`Slabs::grow`] pins them.
    pub(super) fn new(block_bytes: usize) -> Self {
        Self {
            block_bytes,
            state: Mutex::new(SlabState::default()),
        }
    }

    /// Allocates one slab (its slots go to the free list).
    pub(super) fn grow(&self, stream: &CudaStream) -> Result<()> {
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| cuda_err("context", e))?;
        // SAFETY: a fresh allocation; its slots are written by a copy before any read.
        let base = unsafe { result::malloc_host(SLAB_BLOCKS * self.block_bytes, 0) }
            .map_err(|e| cuda_err("pinned host memory", e))? as usize;
        let mut st = self.state.lock();
        st.slabs.push(base);
        st.free
            .extend((0..SLAB_BLOCKS).map(|i| base + i * self.block_bytes));
        Ok(())
    }

    /// A free slot (none: an error, nothing taken).
    pub(super) fn take(&self) -> Result<usize> {
        self.state
            .lock()
            .free
            .pop()
            .ok_or_else(|| cuda_err("pinned host memory", "every slot is in use"))
    }

    /// A slot back to the free list.
    pub(super) fn give_back(&self, slot: usize) {
        self.state.lock().free.push(slot);
    }

    /// Bytes pinned.
    pub(super) fn bytes(&self) -> usize {
        self.state.lock().slabs.len() * SLAB_BLOCKS * self.block_bytes
    }

    /// `d` in a pinned slot: as it is when it is one, else copied into a free slot (none
    /// free: an error).
    pub(super) fn pin(slabs: &Arc<Self>, d: &BlockData) -> Result<BlockData> {
        if d.as_any().is::<PinnedBlock>() {
            return Ok(d.clone());
        }
        let slot = slabs.take()?;
        // SAFETY: a free slot of block_bytes bytes, owned by the block made here; no copy
        // touches it until the ones queued after this.
        unsafe { std::slice::from_raw_parts_mut(slot as *mut u8, slabs.block_bytes) }
            .copy_from_slice(d.bytes());
        Ok(Arc::new(PinnedBlock {
            slabs: slabs.clone(),
            slot,
            ready: None,
        }))
    }
}

impl Drop for Slabs {
    fn drop(&mut self) {
        for &p in &self.state.get_mut().slabs {
            // SAFETY: allocated by `malloc_host`; the stream was synchronized first.
            let _ = unsafe { result::free_host(p as *mut std::ffi::c_void) };
        }
    }
}

/// One block in a pinned slot; its bytes are valid once `ready` has completed (`None`: the
/// host wrote them).
pub(super) struct PinnedBlock {
    pub(super) slabs: Arc<Slabs>,
    /// The slot's address.
    pub(super) slot: usize,
    pub(super) ready: Option<Arc<CudaEvent>>,
}

// SAFETY: the slot is plain host memory owned by this value until drop; reads wait on the
// event, and the only writer is the copy that event follows.
unsafe impl Send for PinnedBlock {}
unsafe impl Sync for PinnedBlock {}

impl HostBuf for PinnedBlock {
    fn bytes(&self) -> &[u8] {
        if let Some(r) = &self.ready {
            let _ = r.synchronize();
        }
        // SAFETY: the slot holds block_bytes bytes, written by the copy waited for above, and
        // no copy writes it while this value lives.
        unsafe { std::slice::from_raw_parts(self.slot as *const u8, self.slabs.block_bytes) }
    }
    fn len(&self) -> usize {
        self.slabs.block_bytes
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        // Later copies into the slot queue behind this block's on the one stream.
        self.slabs.give_back(self.slot);
    }
}
