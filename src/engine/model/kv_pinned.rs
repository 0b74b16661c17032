//! KV blocks moved between the GPU cache and pinned host memory on a copy stream of their own,
//! overlapped with the engine's steps: the [`BlockIo`] of the KV tiers on CUDA.
//!
//! - A demotion gathers the blocks into a block-major device staging buffer with one kernel
//!   (`kernels/kv_move.cu`) on the engine's stream (so it reads them before anything after it
//!   can reuse them), then the copy stream waits for that and copies each block to a slot of
//!   a pinned slab with `cuMemcpyDtoHAsync`.
//! - A load copies each block's slot into a staging buffer on the copy stream, waits there for
//!   the engine's stream to reach the point of the load (the fresh blocks' previous owner is
//!   done with them), scatters the staging into the cache with one kernel, and hands back a
//!   ticket: the sequence runs once it is done; nobody else waits. With `direct`
//!   (`KernelOptions::kv_load_direct`) the scatter kernel reads the pinned slots itself over
//!   PCIe (no staging buffer, no copy a block).
//!
//! Invariants: slots are written and read only on the copy stream (in order) or by the host
//! after the copy's event (`PinnedBlock::bytes`); a loaded block is read by the engine's
//! stream only after the host saw its ticket done; staging buffers and the host blocks a load
//! reads stay alive until their event completed (`in_flight`); slabs are freed only after
//! both streams are idle.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg, result, sys,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::{Device, Storage};
use parking_lot::Mutex;

use super::kv_cache::{KvIo, MOVE_CHUNK};
use super::kv_slabs::{PinnedBlock, Slabs, cuda_err};
use crate::cache::{BlockData, BlockIo, LoadTicket};
use crate::error::{Error, Result};

static KV_MOVE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kv_move.fatbin"));

/// What a queued move keeps alive until its event completes.
struct InFlight {
    done: CudaEvent,
    _staging: Option<CudaSlice<u8>>,
    _sources: Vec<BlockData>,
}

/// A chunk's block ids, passed to the kernels by value (`KvIds` in `kernels/kv_move.cu`).
#[repr(C)]
#[derive(Clone, Copy)]
struct KvIds([u32; MOVE_CHUNK]);

// SAFETY: plain old data, laid out as the kernel's `struct KvIds { uint32_t b[64]; }`.
unsafe impl DeviceRepr for KvIds {}

/// A chunk's pinned source slots, by value (`KvSrcs` in `kernels/kv_move.cu`): host addresses,
/// which unified addressing maps at the same address on the device.
#[repr(C)]
#[derive(Clone, Copy)]
struct KvSrcs([u64; MOVE_CHUNK]);

// SAFETY: plain old data, laid out as the kernel's `struct KvSrcs { const uint4* p[64]; }`.
unsafe impl DeviceRepr for KvSrcs {}

impl KvIds {
    fn of(chunk: &[u32]) -> Self {
        let mut b = [0u32; MOVE_CHUNK];
        b[..chunk.len()].copy_from_slice(chunk);
        Self(b)
    }
}

/// The KV tiers' block mover on CUDA: pinned slots, asynchronous copies, one kernel a chunk.
pub struct PinnedKvIo {
    /// The engine's stream.
    stream: Arc<CudaStream>,
    /// The copies' stream.
    copy: Arc<CudaStream>,
    slabs: Arc<Slabs>,
    in_flight: Mutex<Vec<InFlight>>,
    gather: CudaFunction,
    scatter: CudaFunction,
    /// Loads read the pinned slots from the scatter kernel (`kv_scatter_host`), no staging.
    scatter_host: Option<CudaFunction>,
    /// The cache tensors' base pointers in a block's order (K, V of each layer).
    caches: CudaSlice<u64>,
    /// Keeps the cache tensors (whose pointers `caches` holds) alive.
    _io: KvIo,
    parts: i32,
    heads: i32,
    row_units: i32,
    head_pitch: i64,
}

impl PinnedKvIo {
    /// A mover for the cache `io` moves, on `device` (a CUDA device), with `reserve` bytes
    /// (the host tier's budget plus the disk writer's queue, when there is a disk tier)
    /// of pinned slots allocated now (pinning is slow: it must not happen while serving);
    /// `direct`: loads read the slots from the scatter kernel instead of copying them first.
    pub fn new(io: KvIo, device: &Device, reserve: usize, direct: bool) -> Result<Self> {
        let Device::Cuda(d) = device else {
            return Err(Error::Engine("pinned KV copies need a CUDA device".into()));
        };
        let stream = d.cuda_stream();
        let parts = io.parts();
        let (heads, slots, hd) = parts[0].dims3()?;
        let elt = parts[0].dtype().size_in_bytes();
        let row_bytes = io.block_size() * hd * elt;
        if !row_bytes.is_multiple_of(16) || !(slots * hd * elt).is_multiple_of(16) {
            return Err(cuda_err("layout", "rows are not whole 16-byte units"));
        }
        let mut ptrs = Vec::with_capacity(parts.len());
        for t in &parts {
            let (storage, layout) = t.storage_and_layout();
            let Storage::Cuda(cs) = &*storage else {
                return Err(cuda_err("cache", "not on the GPU"));
            };
            use candle_core::cuda_backend::CudaStorageSlice as S;
            let base = match &cs.slice {
                S::BF16(s) => s.device_ptr(&stream).0,
                S::F16(s) => s.device_ptr(&stream).0,
                S::F32(s) => s.device_ptr(&stream).0,
                // fp8 caches hold e4m3 bytes (`kv_format::FP8_STORAGE`).
                S::U8(s) => s.device_ptr(&stream).0,
                _ => return Err(cuda_err("cache", "unsupported dtype")),
            };
            ptrs.push(base + (layout.start_offset() * elt) as u64);
        }
        let caches = stream
            .clone_htod(&ptrs)
            .map_err(|e| cuda_err("cache pointers", e))?;
        let copy = stream
            .context()
            .new_stream()
            .map_err(|e| cuda_err("copy stream", e))?;
        // The pointer table is read on the copy stream too.
        stream.synchronize().map_err(|e| cuda_err("stream", e))?;
        let module = stream
            .context()
            .load_module(Ptx::from_binary(KV_MOVE.to_vec()))
            .map_err(|e| cuda_err("module kv_move", e))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| cuda_err(&format!("function {name}"), e))
        };
        let slabs = Arc::new(Slabs::new(io.block_bytes()));
        // Pinned at start-up, all of it: pinning runs at ~2 GB/s and holds the driver's lock,
        // so pinning while serving (on demand, or on a thread of its own) stalled every step
        // behind it (BENCHMARKS.md). `reserve` holds the host tier's budget and the disk
        // writer's queue; eight moves in flight come on top.
        let t = std::time::Instant::now();
        let reserve = reserve + 8 * MOVE_CHUNK * io.block_bytes();
        while slabs.bytes() < reserve {
            if let Err(e) = slabs.grow(&stream) {
                tracing::warn!(error = %e, pinned = slabs.bytes(), "pinning host memory for the KV tiers stopped early");
                break;
            }
        }
        if reserve > 0 {
            tracing::info!(
                gib = format!("{:.1}", slabs.bytes() as f64 / (1u64 << 30) as f64),
                ms = t.elapsed().as_millis() as u64,
                "pinned host memory for the KV tiers"
            );
        }
        if direct {
            tracing::info!("KV tier loads read the pinned host slots from the scatter kernel");
        }
        Ok(Self {
            gather: f("kv_gather")?,
            scatter: f("kv_scatter")?,
            scatter_host: direct.then(|| f("kv_scatter_host")).transpose()?,
            caches,
            parts: parts.len() as i32,
            heads: heads as i32,
            row_units: (row_bytes / 16) as i32,
            head_pitch: ((slots * hd * elt) / 16) as i64,
            _io: io,
            stream,
            copy,
            slabs,
            in_flight: Mutex::new(Vec::new()),
        })
    }

    /// Drops what completed moves kept alive.
    fn reap(&self) {
        self.in_flight.lock().retain(|f| !f.done.is_complete());
    }

    /// An event recorded on `on` now.
    fn event(&self, on: &CudaStream) -> Result<CudaEvent> {
        let e = self
            .stream
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| cuda_err("event", e))?;
        e.record(on).map_err(|e| cuda_err("event", e))?;
        Ok(e)
    }

    /// Makes `waiter` wait for what `on` has queued so far.
    fn order(&self, waiter: &CudaStream, on: &CudaStream) -> Result<()> {
        let e = self.event(on)?;
        waiter.wait(&e).map_err(|e| cuda_err("stream wait", e))
    }

    /// Launches `f` over the chunk's blocks between the caches and `other`, on stream `on`:
    /// gather or scatter with a staging buffer's address, or `kv_scatter_host` with the chunk's
    /// pinned slots ([`KvSrcs`]).
    fn launch<A: DeviceRepr>(
        &self,
        on: &CudaStream,
        f: &CudaFunction,
        chunk: &[u32],
        other: &A,
    ) -> Result<()> {
        let n = chunk.len();
        let ids = KvIds::of(chunk);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, self.parts as u32, self.heads as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = on.launch_builder(f);
        b.arg(&self.caches)
            .arg(&ids)
            .arg(other)
            .arg(&self.parts)
            .arg(&self.heads)
            .arg(&self.row_units)
            .arg(&self.head_pitch);
        // SAFETY: the arguments match the kernel's signature; `ids` holds n (<= 64) cache blocks
        // of this cache, `other` (a staging buffer or the pinned slots) n blocks' bytes, alive
        // until the move's event.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err("kv_move kernel", e))?;
        Ok(())
    }

    /// A staging buffer for `n` blocks, allocated on (and freed in the order of) stream `on`
    /// (stream-ordered: nothing waits).
    fn staging(&self, on: &Arc<CudaStream>, n: usize) -> Result<(CudaSlice<u8>, u64)> {
        // SAFETY: every byte is written (by the gather kernel or the uploads) before it is read.
        let staging = unsafe { on.alloc::<u8>(n * self.slabs.block_bytes) }
            .map_err(|e| cuda_err("staging", e))?;
        let ptr = staging.device_ptr(on).0;
        Ok((staging, ptr))
    }
}

impl Drop for PinnedKvIo {
    fn drop(&mut self) {
        let _ = self.copy.synchronize();
        let _ = self.stream.synchronize();
    }
}

/// A load's completion: an event on the copy stream after its scatter.
struct CopyDone(CudaEvent);

impl crate::cache::Ticket for CopyDone {
    fn done(&self) -> bool {
        self.0.is_complete()
    }
    fn wait(&self) {
        let _ = self.0.synchronize();
    }
}

impl BlockIo for PinnedKvIo {
    fn read(&self, blocks: &[u32]) -> Result<Vec<BlockData>> {
        self.reap();
        let bb = self.slabs.block_bytes;
        let mut out: Vec<BlockData> = Vec::with_capacity(blocks.len());
        for chunk in blocks.chunks(MOVE_CHUNK) {
            // The chunk's slots first: none free, and nothing of this chunk is queued.
            let mut slots = Vec::with_capacity(chunk.len());
            for _ in chunk {
                match self.slabs.take() {
                    Ok(p) => slots.push(p),
                    Err(e) => {
                        slots.iter().for_each(|&p| self.slabs.give_back(p));
                        return Err(e);
                    }
                }
            }
            // The gather on the engine's stream: it reads the blocks before anything queued
            // after it (a new owner) writes them.
            let queued = self
                .staging(&self.stream, chunk.len())
                .and_then(|(staging, src)| {
                    self.launch(&self.stream, &self.gather, chunk, &src)?;
                    self.order(&self.copy, &self.stream)?;
                    Ok((staging, src))
                });
            let (staging, src) = match queued {
                Ok(q) => q,
                Err(e) => {
                    slots.iter().for_each(|&p| self.slabs.give_back(p));
                    return Err(e);
                }
            };
            for (j, &slot) in slots.iter().enumerate() {
                // SAFETY: the slot has bb bytes and is owned by the block made below; the
                // staging buffer holds chunk.len() * bb bytes and lives until `done`.
                let dst = unsafe { std::slice::from_raw_parts_mut(slot as *mut u8, bb) };
                if let Err(e) = unsafe {
                    result::memcpy_dtoh_async(dst, src + (j * bb) as u64, self.copy.cu_stream())
                } {
                    // A failed copy call is the device's error: wait until nothing reads the
                    // staging buffer or writes the slots, then give them back.
                    let _ = self.copy.synchronize();
                    slots.iter().for_each(|&p| self.slabs.give_back(p));
                    return Err(cuda_err("device to host", e));
                }
            }
            let ready = Arc::new(self.event(&self.copy)?);
            out.extend(slots.into_iter().map(|slot| {
                Arc::new(PinnedBlock {
                    slabs: self.slabs.clone(),
                    slot,
                    ready: Some(ready.clone()),
                }) as BlockData
            }));
            // The staging buffer was allocated on the engine's stream: it is dropped (freed in
            // that stream's order) only once `done`, after the copies that read it, completed.
            self.in_flight.lock().push(InFlight {
                done: self.event(&self.copy)?,
                _staging: Some(staging),
                _sources: vec![],
            });
        }
        Ok(out)
    }

    fn write(&self, blocks: &[u32], data: &[BlockData]) -> Result<Option<LoadTicket>> {
        self.reap();
        let n = blocks.len().min(data.len());
        self._io.check(&data[..n])?;
        if n == 0 {
            return Ok(None);
        }
        // By chunks: each chunk's sources in pinned slots (blocks read from disk are copied
        // into one: a copy from pageable memory would make the host wait for the copy stream),
        // then its copies queued. A chunk that finds no free slot waits for the copies queued
        // so far (this load's earlier chunks among them) to finish and give theirs back, then
        // tries once more; only then does the load fail (a whole transcript read from disk
        // can need more slots than a full host tier leaves free).
        let mut ticket = None;
        for (bs, ds) in blocks[..n]
            .chunks(MOVE_CHUNK)
            .zip(data[..n].chunks(MOVE_CHUNK))
        {
            let sources = match self.pin_sources(ds) {
                Ok(s) => s,
                Err(_) => {
                    let _ = self.copy.synchronize();
                    self.reap();
                    self.pin_sources(ds)?
                }
            };
            match self.queue_load(bs, &sources) {
                Ok(t) => ticket = t,
                Err(e) => {
                    // Chunks already queued may still be writing the blocks the sequence will
                    // now recompute on the engine's stream.
                    let _ = self.copy.synchronize();
                    return Err(e);
                }
            }
        }
        Ok(ticket)
    }
}

impl PinnedKvIo {
    /// `data` with every block in a pinned slot: pinned blocks as they are, others copied into
    /// a free slot (none free: an error, the slots taken so far given back).
    fn pin_sources(&self, data: &[BlockData]) -> Result<Vec<BlockData>> {
        data.iter().map(|d| Slabs::pin(&self.slabs, d)).collect()
    }

    /// Queues a load of `sources` (pinned blocks) into `blocks` on the copy stream.
    fn queue_load(&self, blocks: &[u32], sources: &[BlockData]) -> Result<Option<LoadTicket>> {
        let bb = self.slabs.block_bytes;
        // The fresh blocks' previous owner (an evicted prefix's gather, a finished sequence's
        // last step) is queued on the engine's stream before this point.
        let before = self.event(&self.stream)?;
        if let Some(f) = &self.scatter_host {
            return self.queue_direct(f, blocks, sources, &before);
        }
        for (chunk, data) in blocks.chunks(MOVE_CHUNK).zip(sources.chunks(MOVE_CHUNK)) {
            let (staging, dst) = self.staging(&self.copy, chunk.len())?;
            for (j, d) in data.iter().enumerate() {
                let p = d
                    .as_any()
                    .downcast_ref::<PinnedBlock>()
                    .expect("sources are pinned");
                // SAFETY: the slot's D2H copy, if any, is queued before this one on the copy
                // stream; the block lives in `in_flight` until `done`.
                let src: &[u8] = unsafe { std::slice::from_raw_parts(p.slot as *const u8, bb) };
                // SAFETY: dst + j * bb has bb bytes of the staging buffer, alive until `done`.
                unsafe {
                    result::memcpy_htod_async(dst + (j * bb) as u64, src, self.copy.cu_stream())
                }
                .map_err(|e| cuda_err("host to device", e))?;
            }
            self.copy
                .wait(&before)
                .map_err(|e| cuda_err("stream wait", e))?;
            self.launch(&self.copy, &self.scatter, chunk, &dst)?;
            self.in_flight.lock().push(InFlight {
                done: self.event(&self.copy)?,
                _staging: Some(staging),
                _sources: data.to_vec(),
            });
        }
        Ok(Some(LoadTicket(Arc::new(CopyDone(
            self.event(&self.copy)?,
        )))))
    }

    /// [`Self::queue_load`] with the scatter kernel `f` (`kv_scatter_host`) reading the pinned
    /// slots itself, a launch a chunk, after `before` (the engine's stream at the load).
    fn queue_direct(
        &self,
        f: &CudaFunction,
        blocks: &[u32],
        sources: &[BlockData],
        before: &CudaEvent,
    ) -> Result<Option<LoadTicket>> {
        self.copy
            .wait(before)
            .map_err(|e| cuda_err("stream wait", e))?;
        for (chunk, data) in blocks.chunks(MOVE_CHUNK).zip(sources.chunks(MOVE_CHUNK)) {
            let mut srcs = KvSrcs([0; MOVE_CHUNK]);
            for (s, d) in srcs.0.iter_mut().zip(data) {
                let p = d
                    .as_any()
                    .downcast_ref::<PinnedBlock>()
                    .ok_or_else(|| cuda_err("load", "a source is not pinned"))?;
                *s = p.slot as u64;
            }
            // The slots are alive in `in_flight` until the launch's event; a D2H copy into a
            // slot is queued before this on the copy stream.
            self.launch(&self.copy, f, chunk, &srcs)?;
            self.in_flight.lock().push(InFlight {
                done: self.event(&self.copy)?,
                _staging: None,
                _sources: data.to_vec(),
            });
        }
        Ok(Some(LoadTicket(Arc::new(CopyDone(
            self.event(&self.copy)?,
        )))))
    }
}
