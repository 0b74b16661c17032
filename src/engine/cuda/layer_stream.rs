//! The streamed decode layer (`kernels/decode_stream_sm90.cu`, `LaunchOptions::layer_stream`):
//! a whole dense layer of a 1-row pure decode step in one launch of one 8-warp block per SM,
//! its weights copied into shared memory by the copy engine ahead of the phase that reads
//! them (each warp a ring of 2 KB pieces), its phases (norm + qkv, attention with the
//! partitions' merge, o, norm + gate|up, down) apart behind grid barriers and per-head
//! counters instead of five kernel boundaries. The matmuls sum as the skinny matmuls do.

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
                // The ring (8 warps, up to 10 pieces of 2 KB) and the staged input rows.
                f.set_attribute(
                    A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    180 << 10,
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

/// `StreamParams` of `kernels/decode_stream_sm90.cu` (pointers, then 64-bit, then 32-bit
/// fields).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct StreamParams {
    w: [u64; 4],
    in_norm: u64,
    post_norm: u64,
    q_w: u64,
    k_w: u64,
    inv_freq: u64,
    res: u64,
    delta: u64,
    res1: u64,
    res_mid: u64,
    res2: u64,
    qkv: u64,
    attn: u64,
    o: u64,
    act: u64,
    down: u64,
    pos: u64,
    slots: u64,
    k_cache: u64,
    v_cache: u64,
    block_tables: u64,
    ctx_lens: u64,
    width: u64,
    part_acc: u64,
    part_ml: u64,
    sync: u64,
    counters: u64,
    num_slots: i64,
    w_width: i32,
    block_size: i32,
    nkv: i32,
    splits: i32,
    hidden: i32,
    inter: i32,
    add: i32,
    eps: f32,
    qk_eps: f32,
    ns: i32,
    mode: i32,
    pad: i32,
}
const _: () = assert!(std::mem::size_of::<StreamParams>() == 296);
const _: () = assert!(std::mem::offset_of!(StreamParams, num_slots) == 240);
const _: () = assert!(std::mem::offset_of!(StreamParams, w_width) == 248);
const _: () = assert!(std::mem::offset_of!(StreamParams, eps) == 276);

/// One layer of a 1-row decode step for [`CudaKernels::decode_stream_into`]: its weights, the
/// step's inputs and the buffers it writes.
pub struct StreamLayer<'a> {
    /// qkv `[(nh + 2 nkv) 128, H]`, o `[H, nh 128]`, gate|up `[2I, H]`, down `[H, I]`.
    pub weights: [&'a Tensor; 4],
    /// The input and post-attention RMSNorm weights and their epsilon.
    pub norms: (&'a Tensor, &'a Tensor, f64),
    /// The q and k head norms (q pre-scaled by 1/sqrt(128)) and their epsilon.
    pub qk_norms: (&'a Tensor, &'a Tensor, f64),
    /// RoPE's inverse frequencies (f32 `[64]`).
    pub inv_freq: &'a Tensor,
    /// The residual stream in, the previous layer's down (None for the first layer), the
    /// stream after the first add, after the second (`[1, H]` each; the two sums in buffers
    /// other than the one they read).
    pub residual: (&'a Tensor, Option<&'a Tensor>, &'a Tensor, &'a Tensor),
    /// qkv, attention, o, SiLU * up and down outputs (`[1, ..]`).
    pub outs: [&'a Tensor; 5],
    /// Position and cache slot of the row (u32 `[1]`).
    pub pos_slots: (&'a Tensor, &'a Tensor),
    /// The layer's K and V caches (`[nkv, slots, 128]`, bf16).
    pub caches: (&'a Tensor, &'a Tensor),
    /// Block table (`[1, w]`), context length (`[1]`), the block size.
    pub tables: (&'a Tensor, &'a Tensor, usize),
    /// The attention partials (`[nh, splits, 128]` and `[nh, splits, 2]`, f32) and `splits`.
    pub scratch: (&'a Tensor, &'a Tensor, usize),
    /// The grid barrier's and merged heads' counters (16 zeroed bytes the layer launches of
    /// one forward share; [`CudaKernels::layer_stream_sync`]) and the per-head merge counters
    /// (u32, at least `nkv`, zero).
    pub sync: (&'a Tensor, &'a Tensor),
}

impl CudaKernels {
    /// Whether [`CudaKernels::decode_stream_into`] serves a pure decode step of `rows` rows
    /// on a layer of `nh` query heads over `nkv` KV heads of `hd` dims whose matmuls have
    /// `hidden` (at most 4,096) and `inter` inputs (bf16, sm_90, the option on).
    pub fn layer_stream_serves(
        &self,
        rows: usize,
        (nh, nkv, hd): (usize, usize, usize),
        (hidden, inter): (usize, usize),
    ) -> bool {
        let piece = |k: usize| k > 0 && k.is_multiple_of(LAYER_STREAM_PIECE);
        self.layer_stream.is_some()
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

    /// The counters of the streamed layer's grid barriers and merged heads (zeroed), when
    /// the kernel is loaded: one pair a forward, shared by its layers' launches (they run one
    /// after another on the stream).
    pub fn layer_stream_sync(&self) -> Result<Option<Tensor>> {
        if self.layer_stream.is_none() {
            return Ok(None);
        }
        let dev = candle_core::Device::Cuda(self.device.clone());
        Ok(Some(Tensor::zeros(4, DType::U32, &dev)?))
    }

    /// A whole dense 1-row decode layer in one launch (see [`StreamLayer`]).
    pub fn decode_stream_into(&self, l: &StreamLayer<'_>) -> Result<()> {
        let Some(sk) = &self.layer_stream else {
            return Err(kernel_err("decode_stream", "not loaded"));
        };
        let (res, delta, res_mid, res2) = l.residual;
        let (tables, ctx_lens, block_size) = l.tables;
        let (acc, ml, splits) = l.scratch;
        let (k_cache, v_cache) = l.caches;
        let (sync, counters) = l.sync;
        let (t, hidden) = res.dims2()?;
        let (nkv, num_slots, hd) = k_cache.dims3()?;
        let nhd = l.outs[1].elem_count() / t.max(1);
        let nh = nhd / hd.max(1);
        let inter = l.outs[3].elem_count() / t.max(1);
        if !self.layer_stream_serves(t, (nh, nkv, hd), (hidden, inter))
            || ctx_lens.elem_count() != 1
            || acc.elem_count() < nh * splits * hd
            || ml.elem_count() < nh * splits * 2
            || sync.elem_count() < 4
            || counters.elem_count() < nkv
            || k_cache.dtype() != self.dtype
        {
            return Err(kernel_err(
                "decode_stream",
                format!("rows {t} nh {nh} nkv {nkv} hd {hd} splits {splits}"),
            ));
        }
        let deferred = hidden <= sk.deferred_max_k;
        let g = (nh / nkv).trailing_zeros() as usize;
        let func = &sk.fs[usize::from(deferred) * 3 + g];
        let p = |x: &Tensor| self.ptr(x);
        let params = StreamParams {
            w: [
                p(l.weights[0])?,
                p(l.weights[1])?,
                p(l.weights[2])?,
                p(l.weights[3])?,
            ],
            in_norm: p(l.norms.0)?,
            post_norm: p(l.norms.1)?,
            q_w: p(l.qk_norms.0)?,
            k_w: p(l.qk_norms.1)?,
            inv_freq: p(l.inv_freq)?,
            res: p(res)?,
            delta: delta.map_or(Ok(0), p)?,
            // Written only with a delta; then it is the stream after the first add.
            res1: p(res_mid)?,
            res_mid: p(if delta.is_some() { res_mid } else { res })?,
            res2: p(res2)?,
            qkv: p(l.outs[0])?,
            attn: p(l.outs[1])?,
            o: p(l.outs[2])?,
            act: p(l.outs[3])?,
            down: p(l.outs[4])?,
            pos: p(l.pos_slots.0)?,
            slots: p(l.pos_slots.1)?,
            k_cache: p(k_cache)?,
            v_cache: p(v_cache)?,
            block_tables: p(tables)?,
            ctx_lens: p(ctx_lens)?,
            width: 0,
            part_acc: p(acc)?,
            part_ml: p(ml)?,
            sync: p(sync)?,
            counters: p(counters)?,
            num_slots: num_slots as i64,
            w_width: tables.elem_count() as i32,
            block_size: block_size as i32,
            nkv: nkv as i32,
            splits: splits as i32,
            hidden: hidden as i32,
            inter: inter as i32,
            add: i32::from(delta.is_some()),
            eps: l.norms.2 as f32,
            qk_eps: l.qk_norms.2 as f32,
            ns: sk.slots as i32,
            mode: sk.mode,
            pad: 0,
        };
        // The ring, the staged input row, the two norms' weights.
        let smem =
            8 * sk.slots * LAYER_STREAM_PIECE * 2 + (hidden.max(nhd).max(inter) + 2 * hidden) * 2;
        let mut lb = self.launcher(func);
        lb.arg(&params);
        // SAFETY: `StreamParams` is the kernel's one parameter (same layout, sizes checked on
        // both sides); the buffers are sized above; the grid is one block per SM of 288
        // threads (8 compute warps and the copy warp), which fits an SM alone, so every block
        // of the grid is resident at once (its grid barriers need it) once the launch before
        // has left.
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
