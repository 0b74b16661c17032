//! The decode layer kernel (`kernels/decode_layer.cu`, `LaunchOptions::layer_kernel`): a
//! whole dense layer of a pure decode step of 1-2 rows in one launch of one block per SM, its
//! phases (norm + qkv, attention, merge, o, norm + gate|up, down) separated by grid-wide
//! barriers instead of five kernel boundaries. The same sums in the same order as the five
//! launches (for contexts of up to 2,048 tokens the same bits).

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute as A;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};
use candle_core::{DType, Tensor};

use super::kernels::{CudaKernels, LaunchOptions};
use super::launch::kernel_err;
use crate::error::Result;

/// Most rows a step of the layer kernel takes.
pub const LAYER_KERNEL_MAX_ROWS: usize = 2;

/// The loaded layer kernels and the L2 prefetch budget of a launch.
pub(crate) struct LayerKernels {
    /// `decode_layer_t{T}_g{G}_{norm,dnorm}`, at `(T - 1) * 6 + deferred * 3 + log2(G)`.
    fs: Vec<CudaFunction>,
    /// Bytes of the layer's weights each launch prefetches into L2 before its first wait.
    prefetch: u64,
    /// Norms over at most this many inputs scale their sums (`dnorm`), as the skinny
    /// matmuls' (`LaunchOptions::norm_deferred`, off under `warp_norm`).
    deferred_max_k: usize,
}

static DECODE_LAYER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/decode_layer.fatbin"));

impl LayerKernels {
    /// The kernels, when `opts.layer_kernel` asks for them and the dtype is bf16 (`load`
    /// loads a module from a fatbin).
    pub(super) fn load(
        opts: &LaunchOptions,
        dtype: DType,
        load: &dyn Fn(&[u8], &str) -> Result<Arc<CudaModule>>,
    ) -> Result<Option<Self>> {
        let Some(mib) = opts.layer_kernel.filter(|_| dtype == DType::BF16) else {
            return Ok(None);
        };
        let m = load(DECODE_LAYER, "decode_layer")?;
        let mut fs = Vec::with_capacity(12);
        for t in 1..=LAYER_KERNEL_MAX_ROWS {
            for norm in ["norm", "dnorm"] {
                for g in [1, 2, 4] {
                    let name = format!("decode_layer_t{t}_g{g}_{norm}");
                    let f = m
                        .load_function(&name)
                        .map_err(|e| kernel_err(&format!("function {name}"), e))?;
                    // Up to 24 KB of rows beside ~36 KB of static shared memory (GQA 4).
                    f.set_attribute(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 96 << 10)
                        .map_err(|e| kernel_err("decode_layer shared memory", e))?;
                    fs.push(f);
                }
            }
        }
        let deferred = (!opts.warp_norm).then_some(opts.norm_deferred).flatten();
        Ok(Some(Self {
            fs,
            prefetch: (mib as u64) << 20,
            deferred_max_k: deferred.unwrap_or(0),
        }))
    }
}

/// `LayerParams` of `kernels/decode_layer.cu` (pointers, then 64-bit, then 32-bit fields).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct LayerParams {
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
    barrier: u64,
    num_slots: i64,
    pf_bytes: u64,
    w_width: i32,
    block_size: i32,
    nkv: i32,
    splits: i32,
    hidden: i32,
    inter: i32,
    add: i32,
    eps: f32,
    qk_eps: f32,
    mode: i32,
}
const _: () = assert!(std::mem::size_of::<LayerParams>() == 288);
const _: () = assert!(std::mem::offset_of!(LayerParams, num_slots) == 232);
const _: () = assert!(std::mem::offset_of!(LayerParams, w_width) == 248);
const _: () = assert!(std::mem::offset_of!(LayerParams, eps) == 276);

/// One layer of a decode step for [`CudaKernels::decode_layer_into`]: its weights, the step's
/// inputs and the buffers it writes.
pub struct DecodeLayer<'a> {
    /// qkv `[(nh + 2 nkv) 128, H]`, o `[H, nh 128]`, gate|up `[2I, H]`, down `[H, I]`.
    pub weights: [&'a Tensor; 4],
    /// The input and post-attention RMSNorm weights and their epsilon.
    pub norms: (&'a Tensor, &'a Tensor, f64),
    /// The q and k head norms (q pre-scaled by 1/sqrt(128)) and their epsilon.
    pub qk_norms: (&'a Tensor, &'a Tensor, f64),
    /// RoPE's inverse frequencies (f32 `[64]`).
    pub inv_freq: &'a Tensor,
    /// The residual stream in, the previous layer's down (None for the first layer), the
    /// stream after the first add, after the second (`[T, H]` each; the two sums in buffers
    /// other than the one they read).
    pub residual: (&'a Tensor, Option<&'a Tensor>, &'a Tensor, &'a Tensor),
    /// qkv, attention, o, SiLU * up and down outputs (`[T, ..]`).
    pub outs: [&'a Tensor; 5],
    /// Positions and cache slots of the rows (u32 `[T]`).
    pub pos_slots: (&'a Tensor, &'a Tensor),
    /// The layer's K and V caches (`[nkv, slots, 128]`, bf16).
    pub caches: (&'a Tensor, &'a Tensor),
    /// Block tables (`[T, w]`), their width on the device (graphs), context lengths (`[T]`),
    /// the block size.
    pub tables: (&'a Tensor, Option<&'a Tensor>, &'a Tensor, usize),
    /// The attention partials (`[T, nh, splits, 128]` and `[T, nh, splits, 2]`, f32) and
    /// `splits`.
    pub scratch: (&'a Tensor, &'a Tensor, usize),
    /// The grid barrier's counter (8 zeroed bytes the layer launches of one forward share;
    /// [`CudaKernels::layer_barrier`]).
    pub barrier: &'a Tensor,
}

impl CudaKernels {
    /// Whether [`CudaKernels::decode_layer_into`] serves a pure decode step of `rows` rows
    /// on a layer of `nh` query heads over `nkv` KV heads of `hd` dims (bf16, the option on).
    pub fn layer_kernel_serves(&self, rows: usize, nh: usize, nkv: usize, hd: usize) -> bool {
        self.layer.is_some()
            && (1..=LAYER_KERNEL_MAX_ROWS).contains(&rows)
            && hd == 128
            && nkv > 0
            && nh.is_multiple_of(nkv)
            && matches!(nh / nkv, 1 | 2 | 4)
    }

    /// The counter of the layer kernel's grid barriers (zeroed), when the kernel is loaded:
    /// one a forward, shared by its layers' launches (they run one after another on the
    /// stream).
    pub fn layer_barrier(&self) -> Result<Option<Tensor>> {
        if self.layer.is_none() {
            return Ok(None);
        }
        let dev = candle_core::Device::Cuda(self.device.clone());
        Ok(Some(Tensor::zeros(2, candle_core::DType::U32, &dev)?))
    }

    /// A whole dense decode layer in one launch (see [`DecodeLayer`]).
    pub fn decode_layer_into(&self, l: &DecodeLayer<'_>) -> Result<()> {
        self.decode_layer_mode_into(l, 0)
    }

    /// Profiling only: [`CudaKernels::decode_layer_into`] with `kernels/decode_layer.cu`'s
    /// `mode` (bits 0-2: stop after phase 1-5; bit 3: the barriers alone; bit 4: sleep
    /// between barrier polls). Only mode 0 (or 16) leaves valid outputs.
    #[doc(hidden)]
    pub fn decode_layer_mode_into(&self, l: &DecodeLayer<'_>, mode: i32) -> Result<()> {
        let Some(lk) = &self.layer else {
            return Err(kernel_err("decode_layer", "not loaded"));
        };
        let (res, delta, res_mid, res2) = l.residual;
        let (tables, width, ctx_lens, block_size) = l.tables;
        let (acc, ml, splits) = l.scratch;
        let (k_cache, v_cache) = l.caches;
        let (t, hidden) = res.dims2()?;
        let (nkv, num_slots, hd) = k_cache.dims3()?;
        let nhd = l.outs[1].elem_count() / t.max(1);
        let nh = nhd / hd.max(1);
        let inter = l.outs[3].elem_count() / t.max(1);
        let need = t * nh * splits;
        if !self.layer_kernel_serves(t, nh, nkv, hd)
            || ctx_lens.elem_count() != t
            || acc.elem_count() < need * hd
            || ml.elem_count() < need * 2
            || l.barrier.elem_count() < 2
            || k_cache.dtype() != self.dtype
        {
            return Err(kernel_err(
                "decode_layer",
                format!("rows {t} nh {nh} nkv {nkv} hd {hd} splits {splits}"),
            ));
        }
        let deferred = hidden <= lk.deferred_max_k;
        let g = (nh / nkv).trailing_zeros() as usize;
        let func = &lk.fs[(t - 1) * 6 + usize::from(deferred) * 3 + g];
        let p = |x: &Tensor| self.ptr(x);
        let params = LayerParams {
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
            width: width.map_or(Ok(0), p)?,
            part_acc: p(acc)?,
            part_ml: p(ml)?,
            barrier: p(l.barrier)?,
            num_slots: num_slots as i64,
            pf_bytes: lk.prefetch,
            w_width: (tables.elem_count() / t) as i32,
            block_size: block_size as i32,
            nkv: nkv as i32,
            splits: splits as i32,
            hidden: hidden as i32,
            inter: inter as i32,
            add: i32::from(delta.is_some()),
            eps: l.norms.2 as f32,
            qk_eps: l.qk_norms.2 as f32,
            mode,
        };
        let smem = t * hidden.max(nhd).max(inter) * 2;
        let mut lb = self.launcher(func);
        lb.arg(&params);
        // SAFETY: `LayerParams` is the kernel's one parameter (same layout, sizes checked on
        // both sides); the buffers are sized above; the grid is one block per SM of 256
        // threads (every block resident at once, as its grid barriers need: one block fits
        // an SM, 226 registers a thread at most).
        unsafe {
            lb.launch(LaunchConfig {
                grid_dim: (self.sms as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: smem as u32,
            })
        }
        .map_err(|e| kernel_err("decode_layer", e))?;
        Ok(())
    }
}
