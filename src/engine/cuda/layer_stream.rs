//! The streamed decode step (`kernels/decode_stream_sm90.cu`, `LaunchOptions::layer_stream`):
//! every dense layer of a 1-row pure decode step in one launch of one block per SM (8
//! compute warps and a copy warp), the weights copied into shared memory by the copy engine
//! ahead of the phase that reads them (each compute warp a ring of 2 KB pieces, kept full
//! across phases and layers), the phases (norm + qkv, attention with the partitions' merge,
//! o, norm + gate|up, down) apart behind grid barriers and per-head counters instead of five
//! kernel boundaries a layer. The matmuls sum as the skinny matmuls do.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute as A;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};
use candle_core::{DType, Tensor};

use super::kernels::{CudaKernels, LaunchOptions};
use super::launch::kernel_err;
use crate::error::Result;

/// Inputs a weight piece holds (2 KB of bf16): every matmul's input width must be a multiple.
pub const LAYER_STREAM_PIECE: usize = 1024;

/// Most ring slots (pieces in flight) a warp of the streamed layer keeps.
pub const LAYER_STREAM_MAX_SLOTS: u8 = 10;

/// Loads a module from a fatbin, naming it in errors.
type ModuleLoad<'a> = &'a dyn Fn(&[u8], &str) -> Result<Arc<CudaModule>>;

/// Most dynamic shared memory a streamed step takes (with the attention's ~37 KB of static
/// shared memory at GQA 4, within the H100/H200's 227 KB a block).
const STREAM_MAX_SMEM: usize = 190 << 10;

/// Dynamic shared memory of a streamed step: the rings (8 warps of `slots` 2 KB pieces), the
/// staged input row, the two norms' weights of two layers.
fn stream_smem(slots: usize, hidden: usize, nhd: usize, inter: usize) -> usize {
    8 * slots * LAYER_STREAM_PIECE * 2 + (hidden.max(nhd).max(inter) + 4 * hidden) * 2
}

/// The loaded streamed-layer kernels.
pub(crate) struct StreamKernels {
    /// `decode_stream_g{G}_{norm,dnorm}`, at `deferred * 3 + log2(G)`.
    fs: Vec<CudaFunction>,
    /// Ring slots a warp.
    slots: usize,
    /// The kernel's profiling mode (0 in the engine).
    mode: i32,
    /// Norms over at most this many inputs scale their sums (`dnorm`), as the skinny
    /// matmuls' (`LaunchOptions::norm_deferred`, off under `warp_norm`).
    deferred_max_k: usize,
}

static DECODE_STREAM: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/decode_stream_sm90.fatbin"));

impl StreamKernels {
    /// The kernels, when `opts.layer_stream` asks for them, the dtype is bf16 and the GPU is
    /// sm_90 (`load` loads a module from a fatbin).
    pub(super) fn load(
        opts: &LaunchOptions,
        dtype: DType,
        sm90: bool,
        load: ModuleLoad<'_>,
    ) -> Result<Option<Self>> {
        let Some(n) = opts.layer_stream.filter(|_| dtype == DType::BF16) else {
            return Ok(None);
        };
        if !sm90 {
            tracing::warn!("layer_stream needs an sm_90 GPU (H100/H200): five launches a layer");
            return Ok(None);
        }
        let slots = usize::from(n.clamp(1, LAYER_STREAM_MAX_SLOTS));
        let m = load(DECODE_STREAM, "decode_stream_sm90")?;
        let mut fs = Vec::with_capacity(6);
        for norm in ["norm", "dnorm"] {
            for g in [1, 2, 4] {
                let name = format!("decode_stream_g{g}_{norm}");
                let f = m
                    .load_function(&name)
                    .map_err(|e| kernel_err(&format!("function {name}"), e))?;
                // The ring, the staged input row and the norms' weights (`stream_smem`).
                f.set_attribute(
                    A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    STREAM_MAX_SMEM as i32,
                )
                .map_err(|e| kernel_err("decode_stream shared memory", e))?;
                fs.push(f);
            }
        }
        super::launch::carve(&fs, 100);
        let deferred = (!opts.warp_norm).then_some(opts.norm_deferred).flatten();
        Ok(Some(Self {
            fs,
            slots,
            mode: i32::from(opts.layer_stream_mode),
            deferred_max_k: deferred.unwrap_or(0),
        }))
    }
}

/// Most layers a model served by the streamed step may have (its launch carries every
/// layer's pointers by value).
pub const LAYER_STREAM_MAX_LAYERS: usize = 40;

/// `LayerPtrs` of `kernels/decode_stream_sm90.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct LayerPtrs {
    /// qkv, o, gate|up, down.
    w: [u64; 4],
    in_norm: u64,
    post_norm: u64,
    q_w: u64,
    k_w: u64,
    k_cache: u64,
    v_cache: u64,
}

/// `StreamParams` of `kernels/decode_stream_sm90.cu` (pointers, then 64-bit, then 32-bit
/// fields).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct StreamParams {
    layers: [LayerPtrs; LAYER_STREAM_MAX_LAYERS],
    inv_freq: u64,
    res0: u64,
    res1: u64,
    qkv: u64,
    attn: u64,
    o: u64,
    act: u64,
    down: u64,
    pos: u64,
    slots: u64,
    block_tables: u64,
    ctx_lens: u64,
    part_acc: u64,
    part_ml: u64,
    sync: u64,
    counters: u64,
    num_slots: i64,
    nlayers: i32,
    block_size: i32,
    nkv: i32,
    splits: i32,
    hidden: i32,
    inter: i32,
    eps: f32,
    qk_eps: f32,
    ns: i32,
    mode: i32,
}
const _: () = assert!(std::mem::size_of::<LayerPtrs>() == 80);
const _: () = assert!(std::mem::size_of::<StreamParams>() == 3376);
const _: () = assert!(std::mem::offset_of!(StreamParams, num_slots) == 3328);
const _: () = assert!(std::mem::offset_of!(StreamParams, eps) == 3360);

/// One dense layer's tensors for [`StreamStep`].
pub struct StreamLayer<'a> {
    /// qkv `[(nh + 2 nkv) 128, H]`, o `[H, nh 128]`, gate|up `[2I, H]`, down `[H, I]`.
    pub weights: [&'a Tensor; 4],
    /// The input and post-attention RMSNorm weights.
    pub norms: (&'a Tensor, &'a Tensor),
    /// The q and k head norms (q pre-scaled by 1/sqrt(128)).
    pub qk_norms: (&'a Tensor, &'a Tensor),
    /// The layer's K and V caches (`[nkv, slots, 128]`, bf16).
    pub caches: (&'a Tensor, &'a Tensor),
}

/// Every layer of a 1-row decode step for [`CudaKernels::decode_stream_into`]: the layers,
/// the step's inputs and the buffers it writes.
pub struct StreamStep<'a> {
    /// The layers, in order (dense, at most [`LAYER_STREAM_MAX_LAYERS`]).
    pub layers: Vec<StreamLayer<'a>>,
    /// The RMSNorms' and the head norms' epsilon.
    pub eps: (f64, f64),
    /// RoPE's inverse frequencies (f32 `[64]`).
    pub inv_freq: &'a Tensor,
    /// The residual stream in (`[1, H]`: the embedding's output) and the other buffer, where
    /// it ends (with the last layer's down still to add).
    pub residual: (&'a Tensor, &'a Tensor),
    /// qkv, attention, o, SiLU * up and down outputs (`[1, ..]`).
    pub outs: [&'a Tensor; 5],
    /// Position and cache slot of the row (u32 `[1]`).
    pub pos_slots: (&'a Tensor, &'a Tensor),
    /// Block table (`[1, w]`), context length (`[1]`), the block size.
    pub tables: (&'a Tensor, &'a Tensor, usize),
    /// The attention partials (`[nh, splits, 128]` and `[nh, splits, 2]`, f32) and `splits`.
    pub scratch: (&'a Tensor, &'a Tensor, usize),
    /// The grid barrier's and merged heads' counters (16 zeroed bytes;
    /// [`CudaKernels::layer_stream_sync`]) and the per-head merge counters (u32, at least
    /// `nkv`, zero).
    pub sync: (&'a Tensor, &'a Tensor),
}

impl CudaKernels {
    /// Whether [`CudaKernels::decode_stream_into`] serves a pure decode step of `rows` rows
    /// on a layer of `nh` query heads over `nkv` KV heads of `hd` dims whose matmuls have
    /// `hidden` (at most 4,096) and `inter` inputs (bf16, sm_90, the option on, its rings
    /// and rows within the shared memory a block has).
    pub fn layer_stream_serves(
        &self,
        rows: usize,
        (nh, nkv, hd): (usize, usize, usize),
        (hidden, inter): (usize, usize),
    ) -> bool {
        let piece = |k: usize| k > 0 && k.is_multiple_of(LAYER_STREAM_PIECE);
        self.layer_stream
            .as_ref()
            .is_some_and(|s| stream_smem(s.slots, hidden, nh * hd, inter) <= STREAM_MAX_SMEM)
            && rows == 1
            && hd == 128
            && nkv > 0
            && nh.is_multiple_of(nkv)
            && matches!(nh / nkv, 1 | 2 | 4)
            && piece(hidden)
            && hidden <= 4096
            && piece(inter)
            && piece(nh * hd)
    }

    /// The counters of the streamed step's grid barriers and merged heads (zeroed), when the
    /// kernel is loaded: one pair a forward's buffers (its launches run one after another on
    /// the stream).
    pub fn layer_stream_sync(&self) -> Result<Option<Tensor>> {
        if self.layer_stream.is_none() {
            return Ok(None);
        }
        let dev = candle_core::Device::Cuda(self.device.clone());
        Ok(Some(Tensor::zeros(4, DType::U32, &dev)?))
    }

    /// Every dense layer of a 1-row decode step in one launch (see [`StreamStep`]).
    pub fn decode_stream_into(&self, l: &StreamStep<'_>) -> Result<()> {
        let Some(sk) = &self.layer_stream else {
            return Err(kernel_err("decode_stream", "not loaded"));
        };
        let (res0, res1) = l.residual;
        let (tables, ctx_lens, block_size) = l.tables;
        let (acc, ml, splits) = l.scratch;
        let (sync, counters) = l.sync;
        let Some(first) = l.layers.first() else {
            return Err(kernel_err("decode_stream", "no layers"));
        };
        let (t, hidden) = res0.dims2()?;
        let (nkv, num_slots, hd) = first.caches.0.dims3()?;
        let nhd = l.outs[1].elem_count() / t.max(1);
        let nh = nhd / hd.max(1);
        let inter = l.outs[3].elem_count() / t.max(1);
        if !self.layer_stream_serves(t, (nh, nkv, hd), (hidden, inter))
            || l.layers.len() > LAYER_STREAM_MAX_LAYERS
            || ctx_lens.elem_count() != 1
            || acc.elem_count() < nh * splits * hd
            || ml.elem_count() < nh * splits * 2
            || sync.elem_count() < 4
            || counters.elem_count() < nkv
            || first.caches.0.dtype() != self.dtype
        {
            return Err(kernel_err(
                "decode_stream",
                format!(
                    "rows {t} nh {nh} nkv {nkv} hd {hd} splits {splits} layers {}",
                    l.layers.len()
                ),
            ));
        }
        let deferred = hidden <= sk.deferred_max_k;
        let g = (nh / nkv).trailing_zeros() as usize;
        let func = &sk.fs[usize::from(deferred) * 3 + g];
        let p = |x: &Tensor| self.ptr(x);
        let mut layers = [LayerPtrs::default(); LAYER_STREAM_MAX_LAYERS];
        for (d, s) in layers.iter_mut().zip(&l.layers) {
            if s.caches.0.dims3()? != (nkv, num_slots, hd) {
                return Err(kernel_err("decode_stream", "caches of different shapes"));
            }
            *d = LayerPtrs {
                w: [
                    p(s.weights[0])?,
                    p(s.weights[1])?,
                    p(s.weights[2])?,
                    p(s.weights[3])?,
                ],
                in_norm: p(s.norms.0)?,
                post_norm: p(s.norms.1)?,
                q_w: p(s.qk_norms.0)?,
                k_w: p(s.qk_norms.1)?,
                k_cache: p(s.caches.0)?,
                v_cache: p(s.caches.1)?,
            };
        }
        let params = StreamParams {
            layers,
            inv_freq: p(l.inv_freq)?,
            res0: p(res0)?,
            res1: p(res1)?,
            qkv: p(l.outs[0])?,
            attn: p(l.outs[1])?,
            o: p(l.outs[2])?,
            act: p(l.outs[3])?,
            down: p(l.outs[4])?,
            pos: p(l.pos_slots.0)?,
            slots: p(l.pos_slots.1)?,
            block_tables: p(tables)?,
            ctx_lens: p(ctx_lens)?,
            part_acc: p(acc)?,
            part_ml: p(ml)?,
            sync: p(sync)?,
            counters: p(counters)?,
            num_slots: num_slots as i64,
            nlayers: l.layers.len() as i32,
            block_size: block_size as i32,
            nkv: nkv as i32,
            splits: splits as i32,
            hidden: hidden as i32,
            inter: inter as i32,
            eps: l.eps.0 as f32,
            qk_eps: l.eps.1 as f32,
            ns: sk.slots as i32,
            mode: sk.mode,
        };
        let smem = stream_smem(sk.slots, hidden, nhd, inter);
        let mut lb = self.launcher(func);
        lb.arg(&params);
        // SAFETY: `StreamParams` is the kernel's one parameter (same layout, sizes checked on
        // both sides; 3,376 bytes, under the 4 KB every CUDA version takes); the buffers are
        // sized above; the grid is one block per SM of 288 threads (8 compute warps and the
        // copy warp), which fits an SM alone, so every block of the grid is resident at once
        // (its grid barriers need it) once the launch before has left.
        unsafe {
            lb.launch(LaunchConfig {
                grid_dim: (self.sms as u32, 1, 1),
                block_dim: (288, 1, 1),
                shared_mem_bytes: smem as u32,
            })
        }
        .map_err(|e| kernel_err("decode_stream", e))?;
        Ok(())
    }
}
