//! KV blocks moved between the GPU cache and pinned host memory without the host waiting:
//! the [`BlockIo`] of the KV tiers on CUDA. A move gathers (or scatters) blocks on the device
//! with [`KvIo`]'s ops and copies each block between a device staging tensor and a slot of a
//! pinned slab with `cuMemcpy*Async` on the engine's one stream, then records an event.
//!
//! Invariants: every copy goes on the engine's stream, so a slot handed back and reused, or a
//! cache block freed and written again, is always touched after the copies queued before it;
//! the host reads a slot only after its copy's event (`PinnedBlock::bytes`); a staging
//! tensor, and the host buffers an upload reads, stay alive until their copies' event has
//! completed (`in_flight`); slabs are freed only after the stream is idle.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaEvent, CudaStream, DevicePtr, result, sys};
use candle_core::{Device, Storage, Tensor};
use parking_lot::Mutex;

use super::kv_cache::{KvIo, MOVE_CHUNK};
use crate::cache::{BlockData, BlockIo, HostBuf};
use crate::error::{Error, Result};

/// Blocks per pinned slab (one `cuMemHostAlloc`).
const SLAB_BLOCKS: usize = 32;

fn cuda_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Engine(format!("KV tier copy: {what}: {e}"))
}

/// Pinned slabs cut into block-sized slots.
struct Slabs {
    block_bytes: usize,
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
    fn take(&self, stream: &CudaStream) -> Result<usize> {
        let mut st = self.state.lock();
        if let Some(p) = st.free.pop() {
            return Ok(p);
        }
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| cuda_err("context", e))?;
        // SAFETY: a fresh allocation; its slots are written by a copy before any read.
        let base = unsafe { result::malloc_host(SLAB_BLOCKS * self.block_bytes, 0) }
            .map_err(|e| cuda_err("pinned host memory", e))? as usize;
        st.slabs.push(base);
        st.free
            .extend((1..SLAB_BLOCKS).map(|i| base + i * self.block_bytes));
        Ok(base)
    }

    fn give_back(&self, slot: usize) {
        self.state.lock().free.push(slot);
    }
}

impl Drop for Slabs {
    fn drop(&mut self) {
        for &p in &self.state.get_mut().slabs {
            // SAFETY: allocated by `malloc_host`; the owner synchronized the stream first.
            let _ = unsafe { result::free_host(p as *mut std::ffi::c_void) };
        }
    }
}

/// One block in a pinned slot; its bytes are valid once `ready` has completed.
struct PinnedBlock {
    slabs: Arc<Slabs>,
    slot: usize,
    ready: Arc<CudaEvent>,
}

// SAFETY: the slot is plain host memory owned by this value until drop; reads wait on the
// event, and the only writer is the copy that event follows.
unsafe impl Send for PinnedBlock {}
unsafe impl Sync for PinnedBlock {}

impl HostBuf for PinnedBlock {
    fn bytes(&self) -> &[u8] {
        let _ = self.ready.synchronize();
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

/// What a queued move keeps alive until its event completes.
struct InFlight {
    done: CudaEvent,
    _staging: Tensor,
    _sources: Vec<BlockData>,
}

/// The KV tiers' block mover on CUDA: pinned slots, asynchronous copies.
pub struct PinnedKvIo {
    io: KvIo,
    stream: Arc<CudaStream>,
    slabs: Arc<Slabs>,
    in_flight: Mutex<Vec<InFlight>>,
}

impl PinnedKvIo {
    /// A mover for the cache `io` moves, on `device` (a CUDA device).
    pub fn new(io: KvIo, device: &Device) -> Result<Self> {
        let Device::Cuda(d) = device else {
            return Err(Error::Engine("pinned KV copies need a CUDA device".into()));
        };
        Ok(Self {
            slabs: Arc::new(Slabs {
                block_bytes: io.block_bytes(),
                state: Mutex::new(SlabState::default()),
            }),
            io,
            stream: d.cuda_stream(),
            in_flight: Mutex::new(Vec::new()),
        })
    }

    fn ptr(&self, t: &Tensor) -> Result<u64> {
        let (storage, layout) = t.storage_and_layout();
        let Storage::Cuda(cs) = &*storage else {
            return Err(cuda_err("staging", "not on the GPU"));
        };
        use candle_core::cuda_backend::CudaStorageSlice as S;
        let (base, size) = match &cs.slice {
            S::BF16(s) => (s.device_ptr(&self.stream).0, 2),
            S::F16(s) => (s.device_ptr(&self.stream).0, 2),
            S::F32(s) => (s.device_ptr(&self.stream).0, 4),
            _ => return Err(cuda_err("staging", "unsupported dtype")),
        };
        Ok(base + (layout.start_offset() * size) as u64)
    }

    /// Drops what completed moves kept alive.
    fn reap(&self) {
        self.in_flight.lock().retain(|f| !f.done.is_complete());
    }

    fn event(&self) -> Result<CudaEvent> {
        let e = self
            .stream
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| cuda_err("event", e))?;
        e.record(&self.stream).map_err(|e| cuda_err("event", e))?;
        Ok(e)
    }
}

impl Drop for PinnedKvIo {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
    }
}

impl BlockIo for PinnedKvIo {
    fn read(&self, blocks: &[u32]) -> Result<Vec<BlockData>> {
        self.reap();
        let bb = self.slabs.block_bytes;
        let mut out: Vec<BlockData> = Vec::with_capacity(blocks.len());
        for chunk in blocks.chunks(MOVE_CHUNK) {
            let staged = self.io.gather(chunk)?;
            let src = self.ptr(&staged)?;
            let mut slots = Vec::with_capacity(chunk.len());
            for j in 0..chunk.len() {
                let slot = self.slabs.take(&self.stream)?;
                // SAFETY: the slot has bb bytes and is owned by the block made below; the
                // staging tensor holds chunk.len() * bb bytes and lives until `done`.
                let dst = unsafe { std::slice::from_raw_parts_mut(slot as *mut u8, bb) };
                if let Err(e) = unsafe {
                    result::memcpy_dtoh_async(dst, src + (j * bb) as u64, self.stream.cu_stream())
                } {
                    self.slabs.give_back(slot);
                    return Err(cuda_err("device to host", e));
                }
                slots.push(slot);
            }
            let ready = Arc::new(self.event()?);
            out.extend(slots.into_iter().map(|slot| {
                Arc::new(PinnedBlock {
                    slabs: self.slabs.clone(),
                    slot,
                    ready: ready.clone(),
                }) as BlockData
            }));
            self.in_flight.lock().push(InFlight {
                done: self.event()?,
                _staging: staged,
                _sources: vec![],
            });
        }
        Ok(out)
    }

    fn write(&self, blocks: &[u32], data: &[BlockData]) -> Result<()> {
        self.reap();
        let n = blocks.len().min(data.len());
        self.io.check(&data[..n])?;
        let bb = self.slabs.block_bytes;
        for (chunk, data) in blocks[..n]
            .chunks(MOVE_CHUNK)
            .zip(data[..n].chunks(MOVE_CHUNK))
        {
            let staging = Tensor::zeros(
                &self.io.staged_shape(chunk.len()),
                self.io.dtype(),
                &self.io.device(),
            )?;
            let dst = self.ptr(&staging)?;
            for (j, d) in data.iter().enumerate() {
                let at = dst + (j * bb) as u64;
                // A pinned slot is read by the copy engine directly; other buffers (blocks read
                // from disk) go through the driver's staging (it has read them on return).
                let src: &[u8] = match d.as_any().downcast_ref::<PinnedBlock>() {
                    // SAFETY: the slot's D2H copy, if any, is queued before this one on the
                    // one stream; the block lives in `in_flight` until `done`.
                    Some(p) => unsafe { std::slice::from_raw_parts(p.slot as *const u8, bb) },
                    None => d.bytes(),
                };
                // SAFETY: `at` has bb bytes of the staging tensor, alive until `done`.
                unsafe { result::memcpy_htod_async(at, src, self.stream.cu_stream()) }
                    .map_err(|e| cuda_err("host to device", e))?;
            }
            self.io.scatter(chunk, &staging)?;
            self.in_flight.lock().push(InFlight {
                done: self.event()?,
                _staging: staging,
                _sources: data.to_vec(),
            });
        }
        Ok(())
    }
}
