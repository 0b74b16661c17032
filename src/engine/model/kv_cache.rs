//! `PagedKvCache`: the KV tensors of every layer, in fixed-size blocks addressed by slot
//! (`block * block_size + offset`). Head-major per layer: `[kv_heads, num_blocks * block_size,
//! head_dim]`, so a sequence's slots of one head are rows of one matrix.
//!
//! Invariant: a slot is written only by the sequence whose block table holds its block; the
//! cache itself does no accounting (that is `cache::KvManager`'s job).

use candle_core::{DType, Device, Tensor};

use std::sync::Arc;

use crate::cache::{BlockData, BlockIo};
use crate::engine::kv_format::{FP8_STORAGE, KvRef, KvScale, quantize};

use super::config::ModelConfig;
use crate::error::Result;

/// The KV memory: per layer one K and one V tensor, head-major: `[kv_heads, num_blocks * block_size, head_dim]`,
/// so that gathering a sequence's slots yields per-head contiguous matrices.
pub struct PagedKvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Per layer, the scales of K and V ([`KvScale::ONE`] unless the cache is fp8).
    scales: Vec<KvScale>,
    block_size: usize,
    num_blocks: usize,
}

impl PagedKvCache {
    /// Allocates `num_blocks` blocks of `block_size` tokens for every layer, stored as
    /// `dtype` (the compute dtype, or `F8E4M3` with scales 1 until
    /// [`PagedKvCache::set_scales`]). `kv_heads` is the number of KV heads this rank holds.
    pub fn new(
        cfg: &ModelConfig,
        kv_heads: usize,
        num_blocks: usize,
        block_size: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let shape = (kv_heads, num_blocks * block_size, cfg.head_dim());
        // e4m3 is kept as its bytes (see `kv_format`).
        let dtype = if dtype == DType::F8E4M3 {
            FP8_STORAGE
        } else {
            dtype
        };
        let mut k = Vec::with_capacity(cfg.num_hidden_layers);
        let mut v = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            k.push(Tensor::zeros(shape, dtype, device)?);
            v.push(Tensor::zeros(shape, dtype, device)?);
        }
        Ok(Self {
            k,
            v,
            scales: vec![KvScale::ONE; cfg.num_hidden_layers],
            block_size,
            num_blocks,
        })
    }

    /// Sets the per-layer scales of an fp8 cache (before anything is stored in it: stored
    /// values are not rescaled). One per layer, each finite and positive.
    pub fn set_scales(&mut self, scales: Vec<KvScale>) -> Result<()> {
        if scales.len() != self.k.len() || !scales.iter().all(KvScale::is_valid) {
            return Err(crate::error::Error::Engine(format!(
                "{} KV scales for {} layers (each finite and positive): {scales:?}",
                scales.len(),
                self.k.len()
            )));
        }
        self.scales = scales;
        Ok(())
    }

    /// The per-layer scales.
    pub fn scales(&self) -> &[KvScale] {
        &self.scales
    }

    /// What a block's bytes mean: the storage dtype, and for fp8 the scales' bits (blocks
    /// written under other scales are other data). Part of the KV tiers' block keys.
    pub fn format_tag(&self) -> String {
        let dtype = self.dtype();
        if dtype != DType::F8E4M3 {
            return format!("{dtype:?}");
        }
        // Scales only: e4m3 bytes hold what the scales say.
        let mut h = crate::digest::Hasher::default();
        for s in &self.scales {
            h.word(u64::from(s.k.to_bits()) << 32 | u64::from(s.v.to_bits()));
        }
        format!("{dtype:?} scales {:016x}", h.finish())
    }

    /// Writes the new tokens' K and V (`[tokens, kv_heads, head_dim]`) of layer `layer` into
    /// their slots (quantized with the layer's scales for fp8); `slot_idx` is u32
    /// `[kv_heads, tokens, head_dim]` (the slot of each token, broadcast), built once per step.
    pub fn write(&self, layer: usize, k: &Tensor, v: &Tensor, slot_idx: &Tensor) -> Result<()> {
        let store = |x: &Tensor, scale: f32| -> Result<Tensor> {
            let x = x.transpose(0, 1)?.contiguous()?;
            match self.k[0].dtype() {
                FP8_STORAGE => quantize(&x, scale),
                d if d != x.dtype() => Ok(x.to_dtype(d)?),
                _ => Ok(x),
            }
        };
        let s = self.scales[layer];
        self.k[layer].scatter_set(slot_idx, &store(k, s.k)?, 1)?;
        self.v[layer].scatter_set(slot_idx, &store(v, s.v)?, 1)?;
        Ok(())
    }

    /// Layer `layer`'s K and V tensors with their scales.
    pub fn layer(&self, layer: usize) -> KvRef<'_> {
        KvRef {
            k: &self.k[layer],
            v: &self.v[layer],
            scale: self.scales[layer],
            fresh: None,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The KV dtype (the compute dtype, or `F8E4M3`, held as its bytes).
    pub fn dtype(&self) -> DType {
        match self.k[0].dtype() {
            FP8_STORAGE => DType::F8E4M3,
            d => d,
        }
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Copies the KV of `blocks` to host memory (for swap-out), one tensor per layer and K/V.
    pub fn read_blocks(&self, blocks: &[u32]) -> Result<Vec<(Tensor, Tensor)>> {
        let idx = self.block_slots(blocks)?;
        let host = Device::Cpu;
        self.k
            .iter()
            .zip(&self.v)
            .map(|(k, v)| {
                Ok((
                    k.index_select(&idx, 1)?.to_device(&host)?,
                    v.index_select(&idx, 1)?.to_device(&host)?,
                ))
            })
            .collect()
    }

    /// Writes KV read by [`PagedKvCache::read_blocks`] into `blocks` (for swap-in).
    pub fn write_blocks(&self, blocks: &[u32], data: &[(Tensor, Tensor)]) -> Result<()> {
        let idx = self.block_slots(blocks)?;
        for ((k, v), (hk, hv)) in self.k.iter().zip(&self.v).zip(data) {
            let dev = k.device();
            scatter_rows(k, &idx, &hk.to_device(dev)?)?;
            scatter_rows(v, &idx, &hv.to_device(dev)?)?;
        }
        Ok(())
    }

    /// A handle that moves whole blocks between this cache and host bytes (the KV tiers
    /// below the GPU); it shares the cache's memory.
    pub fn io(&self) -> KvIo {
        KvIo {
            k: self.k.clone(),
            v: self.v.clone(),
            block_size: self.block_size,
        }
    }

    fn block_slots(&self, blocks: &[u32]) -> Result<Tensor> {
        block_slots(blocks, self.block_size, self.k[0].device())
    }
}

/// The slots (u32 `[blocks.len() * block_size]`, on `device`) of whole blocks, in order.
fn block_slots(blocks: &[u32], block_size: usize, device: &Device) -> Result<Tensor> {
    let bs = block_size as u32;
    let slots: Vec<u32> = blocks
        .iter()
        .flat_map(|b| (0..bs).map(move |o| b * bs + o))
        .collect();
    Ok(Tensor::new(slots.as_slice(), device)?)
}

/// Writes `src` (`[kv_heads, n, head_dim]`) into the slots `idx` (u32 `[n]`) of a head-major
/// cache tensor (`[kv_heads, slots, head_dim]`), in place.
fn scatter_rows(dst: &Tensor, idx: &Tensor, src: &Tensor) -> Result<()> {
    let (heads, n, hd) = src.dims3()?;
    let idx = idx
        .reshape((1, n, 1))?
        .broadcast_as((heads, n, hd))?
        .contiguous()?;
    dst.scatter_set(&idx, &src.contiguous()?, 1)?;
    Ok(())
}

/// Moves whole blocks of a [`PagedKvCache`] to and from host bytes: a block's bytes are, for
/// every layer, its K rows then its V rows (`[kv_heads, block_size, head_dim]` each, in the
/// cache's dtype).
#[derive(Clone)]
pub struct KvIo {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    block_size: usize,
}

impl KvIo {
    /// Bytes of one block's part of one layer's K (or V).
    fn part_bytes(&self) -> usize {
        let (heads, _, hd) = self.k[0].dims3().unwrap_or((0, 0, 0));
        heads * self.block_size * hd * self.k[0].dtype().size_in_bytes()
    }
}

/// A host tensor's bytes as they lie in memory (a memcpy, not an element-wise conversion:
/// a 32k-token transcript of the 1.7B is 3.7 GB).
fn host_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return Err(crate::error::Error::Engine(
            "KV block bytes must be read from a host tensor".into(),
        ));
    };
    let (a, b) = layout
        .contiguous_offsets()
        .ok_or_else(|| crate::error::Error::Engine("a non-contiguous host tensor".into()))?;
    fn raw<T: Copy>(v: &[T]) -> Vec<u8> {
        // SAFETY: `T` is a plain numeric type (f32, f16, bf16: no padding, every bit pattern
        // valid as bytes); the slice is live for the duration of the copy.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
            .to_vec()
    }
    Ok(match cpu {
        candle_core::CpuStorage::BF16(v) => raw(&v[a..b]),
        candle_core::CpuStorage::F16(v) => raw(&v[a..b]),
        candle_core::CpuStorage::F32(v) => raw(&v[a..b]),
        candle_core::CpuStorage::U8(v) => v[a..b].to_vec(),
        _ => {
            return Err(crate::error::Error::Engine(format!(
                "KV blocks of dtype {:?} cannot move between tiers",
                t.dtype()
            )));
        }
    })
}

impl KvIo {
    /// Bytes of one block (every layer's K and V).
    pub fn block_bytes(&self) -> usize {
        self.part_bytes() * 2 * self.k.len()
    }

    /// The KV of `blocks` gathered on the cache's device, block-major:
    /// `[n, layers * 2, kv_heads, block_size * head_dim]` (a block's bytes are contiguous).
    pub fn gather(&self, blocks: &[u32]) -> Result<Tensor> {
        let n = blocks.len();
        let idx = block_slots(blocks, self.block_size, self.k[0].device())?;
        let (heads, _, hd) = self.k[0].dims3()?;
        let row = self.block_size * hd;
        let parts = self
            .parts()
            .into_iter()
            .map(|t| {
                t.index_select(&idx, 1)?
                    .reshape((heads, n, row))?
                    .transpose(0, 1)
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Tensor::stack(&parts, 1)?.contiguous()?)
    }

    /// Writes a tensor laid out as [`KvIo::gather`]'s (on the cache's device) into `blocks`.
    pub fn scatter(&self, blocks: &[u32], staged: &Tensor) -> Result<()> {
        let n = blocks.len();
        let idx = block_slots(blocks, self.block_size, self.k[0].device())?;
        let (heads, _, hd) = self.k[0].dims3()?;
        for (i, t) in self.parts().into_iter().enumerate() {
            let rows = staged
                .narrow(1, i, 1)?
                .squeeze(1)?
                .transpose(0, 1)?
                .contiguous()?
                .reshape((heads, n * self.block_size, hd))?;
            scatter_rows(t, &idx, &rows)?;
        }
        Ok(())
    }

    /// The shape [`KvIo::gather`] gives for `n` blocks.
    pub fn staged_shape(&self, n: usize) -> [usize; 4] {
        let (heads, _, hd) = self.k[0].dims3().unwrap_or((0, 0, 0));
        [n, 2 * self.k.len(), heads, self.block_size * hd]
    }

    /// The cache tensors in a block's order: K then V of layer 0, then of layer 1, ...
    pub fn parts(&self) -> Vec<&Tensor> {
        self.k
            .iter()
            .zip(&self.v)
            .flat_map(|(k, v)| [k, v])
            .collect()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The cache's device.
    pub fn device(&self) -> Device {
        self.k[0].device().clone()
    }

    /// The cache's dtype.
    pub fn dtype(&self) -> DType {
        self.k[0].dtype()
    }

    /// Checks that every buffer is one block of this cache.
    pub fn check(&self, data: &[BlockData]) -> crate::error::Result<()> {
        let want = self.block_bytes();
        match data.iter().find(|d| d.len() != want) {
            Some(bad) => Err(crate::error::Error::Engine(format!(
                "a KV block of {} bytes where this cache's blocks have {want}",
                bad.len()
            ))),
            None => Ok(()),
        }
    }
}

/// Blocks per gather or scatter: bounds the device memory a move takes beside the KV pool
/// (64 blocks of the 1.7B: 117 MB).
pub const MOVE_CHUNK: usize = 64;

impl BlockIo for KvIo {
    fn read(&self, blocks: &[u32]) -> crate::error::Result<Vec<BlockData>> {
        let mut out: Vec<BlockData> = Vec::with_capacity(blocks.len());
        for chunk in blocks.chunks(MOVE_CHUNK) {
            let bytes = host_bytes(&self.gather(chunk)?.to_device(&Device::Cpu)?)?;
            let per = bytes.len() / chunk.len();
            out.extend(
                bytes
                    .chunks_exact(per)
                    .map(|b| std::sync::Arc::new(b.to_vec()) as BlockData),
            );
        }
        Ok(out)
    }

    /// On a thread of its own (the scheduler goes on with other sequences meanwhile, as
    /// with CUDA's copy stream); candle's storage locks order it with the forwards.
    fn write(
        &self,
        blocks: &[u32],
        data: &[BlockData],
    ) -> crate::error::Result<Option<crate::cache::LoadTicket>> {
        let n = blocks.len().min(data.len());
        self.check(&data[..n])?;
        if n == 0 {
            return Ok(None);
        }
        let ticket = Arc::new(ThreadTicket::default());
        // On a GPU (the fallback when pinned copies are unavailable) the copy runs here, on
        // the thread that owns the device's stream: a second thread driving candle's CUDA
        // ops was seen to hang there.
        if !self.k[0].device().is_cpu() {
            let ok = self.write_now(&blocks[..n], &data[..n]);
            if let Err(e) = &ok {
                tracing::warn!(error = %e, "loading KV blocks failed");
            }
            *ticket.state.lock() = Some(ok.is_ok());
            return Ok(Some(crate::cache::LoadTicket(ticket)));
        }
        let (io, blocks, data) = (self.clone(), blocks[..n].to_vec(), data[..n].to_vec());
        let t = ticket.clone();
        std::thread::spawn(move || {
            let r = io.write_now(&blocks, &data);
            if let Err(e) = &r {
                tracing::warn!(error = %e, "loading KV blocks failed");
            }
            *t.state.lock() = Some(r.is_ok());
            t.cv.notify_all();
        });
        Ok(Some(crate::cache::LoadTicket(ticket)))
    }
}

impl KvIo {
    fn write_now(&self, blocks: &[u32], data: &[BlockData]) -> crate::error::Result<()> {
        for (chunk, data) in blocks.chunks(MOVE_CHUNK).zip(data.chunks(MOVE_CHUNK)) {
            let mut staged = Vec::with_capacity(chunk.len() * self.block_bytes());
            for d in data {
                staged.extend_from_slice(d.bytes());
            }
            let host = Tensor::from_raw_buffer(
                &staged,
                self.dtype(),
                &self.staged_shape(chunk.len()),
                &Device::Cpu,
            )?;
            self.scatter(chunk, &host.to_device(self.k[0].device())?)?;
        }
        Ok(())
    }
}

/// A load on a thread: `None` while it runs, then whether it succeeded.
#[derive(Default)]
struct ThreadTicket {
    state: parking_lot::Mutex<Option<bool>>,
    cv: parking_lot::Condvar,
}

impl crate::cache::Ticket for ThreadTicket {
    fn done(&self) -> bool {
        self.state.lock().is_some()
    }
    fn wait(&self) {
        let mut s = self.state.lock();
        while s.is_none() {
            self.cv.wait(&mut s);
        }
    }
    fn ok(&self) -> bool {
        *self.state.lock() == Some(true)
    }
}
