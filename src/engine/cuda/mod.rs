//! The engine's own CUDA kernels (`kernels/*.cu`, compiled by `build.rs` to fatbins with
//! sm_80/sm_90 machine code and embedded here) and their launches on candle tensors.
//!
//! Invariants: every launch goes on the device's one stream (candle's), reads and writes only
//! contiguous tensors it is given, allocates only its outputs, and never synchronizes with the
//! host, so a decode forward made of these launches and cuBLAS matmuls can be graph-captured.
//! Only bf16 and f32 activations and head_dim 64/128 are served; other models use the candle
//! path.

mod forward;

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Device, Shape, Storage, Tensor};

use crate::error::{Error, Result};

static ATTENTION: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/attention.fatbin"));
static LAYER_OPS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/layer_ops.fatbin"));

/// Context tokens one decode-attention block takes (a partition of flash-decoding).
const DECODE_PARTITION: usize = 256;

/// Query tokens one CUDA-core prefill-attention block takes (`BQ` in `kernels/attention.cu`).
const PREFILL_TILE: usize = 16;

fn kernel_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Engine(format!("CUDA kernel {what}: {e}"))
}

/// The kernels of one dtype, loaded on one device.
pub struct CudaKernels {
    device: CudaDevice,
    stream: Arc<CudaStream>,
    dtype: DType,
    _modules: [Arc<CudaModule>; 2],
    add_rmsnorm: CudaFunction,
    qk_rope_hd128: CudaFunction,
    qk_rope_hd64: CudaFunction,
    silu_mul: CudaFunction,
    argmax_f32: CudaFunction,
    topk_f32: CudaFunction,
    embedding: CudaFunction,
    gather_rows: CudaFunction,
    to_f32: CudaFunction,
    decode: [CudaFunction; 4],
    decode_reduce: CudaFunction,
    prefill: [CudaFunction; 3],
    /// The tensor-core prefill kernels (bf16 only), for GQA groups 1, 2, 4, 8.
    prefill_tc: Option<[CudaFunction; 4]>,
}

impl std::fmt::Debug for CudaKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKernels")
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl CudaKernels {
    /// Loads the kernels for `dtype` on `device`; `None` on the CPU or for a dtype the kernels
    /// do not serve (f16).
    pub fn new(device: &Device, dtype: DType) -> Result<Option<Self>> {
        let Device::Cuda(dev) = device else {
            return Ok(None);
        };
        let suffix = match dtype {
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            _ => return Ok(None),
        };
        let stream = dev.cuda_stream();
        let ctx = stream.context().clone();
        let load = |bytes: &[u8], name: &str| {
            ctx.load_module(Ptx::from_binary(bytes.to_vec()))
                .map_err(|e| kernel_err(&format!("module {name}"), e))
        };
        let attention = load(ATTENTION, "attention")?;
        let layer_ops = load(LAYER_OPS, "layer_ops")?;
        let f = |m: &Arc<CudaModule>, name: &str| {
            m.load_function(name)
                .map_err(|e| kernel_err(&format!("function {name}"), e))
        };
        let s = suffix;
        Ok(Some(Self {
            device: dev.clone(),
            dtype,
            add_rmsnorm: f(&layer_ops, &format!("add_rmsnorm_{s}"))?,
            qk_rope_hd128: f(&layer_ops, &format!("qk_norm_rope_kv_write_hd128_{s}"))?,
            qk_rope_hd64: f(&layer_ops, &format!("qk_norm_rope_kv_write_hd64_{s}"))?,
            silu_mul: f(&layer_ops, &format!("silu_mul_{s}"))?,
            argmax_f32: f(&layer_ops, "argmax_rows_f32")?,
            topk_f32: f(&layer_ops, "topk_rows_f32")?,
            embedding: f(&layer_ops, &format!("embedding_{s}"))?,
            gather_rows: f(&layer_ops, &format!("gather_rows_{s}"))?,
            to_f32: f(&layer_ops, &format!("to_f32_{s}"))?,
            prefill: [
                f(&attention, &format!("paged_prefill_g1_{s}"))?,
                f(&attention, &format!("paged_prefill_g2_{s}"))?,
                f(&attention, &format!("paged_prefill_g4_{s}"))?,
            ],
            prefill_tc: if dtype == DType::BF16 {
                Some([
                    f(&attention, "paged_prefill_tc_g1_bf16")?,
                    f(&attention, "paged_prefill_tc_g2_bf16")?,
                    f(&attention, "paged_prefill_tc_g4_bf16")?,
                    f(&attention, "paged_prefill_tc_g8_bf16")?,
                ])
            } else {
                None
            },
            decode: [
                f(&attention, &format!("paged_decode_g1_{s}"))?,
                f(&attention, &format!("paged_decode_g2_{s}"))?,
                f(&attention, &format!("paged_decode_g4_{s}"))?,
                f(&attention, &format!("paged_decode_g8_{s}"))?,
            ],
            decode_reduce: f(&attention, &format!("paged_decode_reduce_{s}"))?,
            stream,
            _modules: [attention, layer_ops],
        }))
    }

    /// The activation dtype these kernels serve.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device pointer of a contiguous CUDA tensor's first element.
    fn ptr(&self, t: &Tensor) -> Result<u64> {
        let (storage, layout) = t.storage_and_layout();
        if !layout.is_contiguous() {
            return Err(kernel_err("input", "a tensor is not contiguous"));
        }
        let Storage::Cuda(cs) = &*storage else {
            return Err(kernel_err("input", "a tensor is not on the GPU"));
        };
        let (base, size) = match &cs.slice {
            CudaStorageSlice::BF16(s) => (s.device_ptr(&self.stream).0, 2),
            CudaStorageSlice::F16(s) => (s.device_ptr(&self.stream).0, 2),
            CudaStorageSlice::F32(s) => (s.device_ptr(&self.stream).0, 4),
            CudaStorageSlice::U32(s) => (s.device_ptr(&self.stream).0, 4),
            _ => return Err(kernel_err("input", "unsupported dtype")),
        };
        Ok(base + (layout.start_offset() * size) as u64)
    }

    /// An uninitialized tensor (every element is written by the kernel that gets it).
    fn alloc(&self, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        let n = shape.elem_count().max(1);
        // SAFETY: the memory is written by the kernel it is allocated for before any read.
        let slice = unsafe {
            match dtype {
                DType::BF16 => CudaStorageSlice::BF16(self.device.alloc::<half::bf16>(n)?),
                DType::F32 => CudaStorageSlice::F32(self.device.alloc::<f32>(n)?),
                DType::U32 => CudaStorageSlice::U32(self.device.alloc::<u32>(n)?),
                DType::F16 => CudaStorageSlice::F16(self.device.alloc::<half::f16>(n)?),
                other => return Err(kernel_err("alloc", format!("dtype {other:?}"))),
            }
        };
        let storage = CudaStorage {
            slice,
            device: self.device.clone(),
        };
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            shape,
            BackpropOp::none(),
            false,
        ))
    }

    /// An output buffer of the activation dtype whose every element a kernel writes.
    pub(crate) fn alloc_out(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        self.alloc(shape, self.dtype)
    }

    fn check_dtype(&self, t: &Tensor) -> Result<()> {
        if t.dtype() != self.dtype {
            return Err(kernel_err(
                "input",
                format!("dtype {:?}, kernels loaded for {:?}", t.dtype(), self.dtype),
            ));
        }
        Ok(())
    }

    /// Adds `x` (when given) to `residual` in place, and returns the RMSNorm of the sum times
    /// `w`, over `residual`'s last dimension. `residual` must be a buffer no other tensor
    /// shares (the forward's own residual stream).
    pub fn add_rmsnorm(
        &self,
        x: Option<&Tensor>,
        residual: &Tensor,
        w: &Tensor,
        eps: f64,
    ) -> Result<Tensor> {
        let out = self.alloc(residual.shape().clone(), self.dtype)?;
        self.add_rmsnorm_into(x, residual, w, eps, &out)?;
        Ok(out)
    }

    /// [`CudaKernels::add_rmsnorm`] writing the normed rows into `out` (residual's shape).
    pub fn add_rmsnorm_into(
        &self,
        x: Option<&Tensor>,
        residual: &Tensor,
        w: &Tensor,
        eps: f64,
        out: &Tensor,
    ) -> Result<()> {
        self.check_dtype(residual)?;
        let n = residual.dim(candle_core::D::Minus1)?;
        let rows = residual.elem_count() / n.max(1);
        if out.elem_count() != residual.elem_count() {
            return Err(kernel_err("add_rmsnorm", "output of the wrong size"));
        }
        let pr = self.ptr(residual)?;
        let (px, add) = match x {
            Some(x) => (self.ptr(x)?, 1i32),
            None => (pr, 0i32),
        };
        let (pw, po) = (self.ptr(w)?, self.ptr(out)?);
        let (n32, eps32) = (n as i32, eps as f32);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (n.clamp(32, 1024).next_multiple_of(32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.add_rmsnorm);
        // res_in and res_out are the same buffer: each element is read, then written, by the
        // same thread.
        b.arg(&px).arg(&pr).arg(&pr).arg(&pw).arg(&po);
        b.arg(&n32).arg(&eps32).arg(&add);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// Scratch for [`CudaKernels::paged_decode_into`]: partial results of `b` sequences over
    /// block tables `w` blocks wide (`None` when one partition covers them). One per forward,
    /// reused by every layer (launches on one stream do not overlap).
    pub fn decode_scratch(
        &self,
        b: usize,
        nh: usize,
        w: usize,
        block_size: usize,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let splits = (w * block_size).div_ceil(DECODE_PARTITION).max(1);
        if splits == 1 || b == 0 {
            return Ok(None);
        }
        Ok(Some((
            self.alloc((b, nh, splits, 128), DType::F32)?,
            self.alloc((b, nh, splits, 2), DType::F32)?,
        )))
    }

    /// q/k RMSNorm + RoPE for every token of `qkv` (`[T, (nh + 2 nkv) * hd]`); writes k and v
    /// into the caches' slots `slots` (u32 `[T]`) and returns q `[T, nh, hd]`.
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope_kv_write(
        &self,
        qkv: &Tensor,
        q_w: &Tensor,
        k_w: &Tensor,
        inv_freq: &Tensor,
        positions: &Tensor,
        slots: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        (nh, nkv, hd): (usize, usize, usize),
        eps: f64,
    ) -> Result<Tensor> {
        let q = self.alloc((qkv.dim(0)?, nh, hd), self.dtype)?;
        self.qk_norm_rope_kv_write_into(
            qkv,
            (q_w, k_w),
            inv_freq,
            (positions, slots),
            (k_cache, v_cache),
            (nh, nkv, hd),
            eps,
            &q,
        )?;
        Ok(q)
    }

    /// [`CudaKernels::qk_norm_rope_kv_write`] writing q into `q` (`[T, nh, hd]`).
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope_kv_write_into(
        &self,
        qkv: &Tensor,
        (q_w, k_w): (&Tensor, &Tensor),
        inv_freq: &Tensor,
        (positions, slots): (&Tensor, &Tensor),
        (k_cache, v_cache): (&Tensor, &Tensor),
        (nh, nkv, hd): (usize, usize, usize),
        eps: f64,
        q: &Tensor,
    ) -> Result<()> {
        self.check_dtype(qkv)?;
        let t = qkv.dim(0)?;
        if q.elem_count() != t * nh * hd {
            return Err(kernel_err("qk_norm_rope", "q output of the wrong size"));
        }
        let func = match hd {
            128 => &self.qk_rope_hd128,
            64 => &self.qk_rope_hd64,
            other => return Err(kernel_err("qk_norm_rope", format!("head_dim {other}"))),
        };
        let num_slots = k_cache.dim(1)? as i64;
        let ptrs = [
            self.ptr(qkv)?,
            self.ptr(q_w)?,
            self.ptr(k_w)?,
            self.ptr(inv_freq)?,
            self.ptr(positions)?,
            self.ptr(slots)?,
            self.ptr(q)?,
            self.ptr(k_cache)?,
            self.ptr(v_cache)?,
        ];
        let (nh32, nkv32, eps32) = (nh as i32, nkv as i32, eps as f32);
        let cfg = LaunchConfig {
            grid_dim: (t as u32, 1, 1),
            block_dim: (32 * (nh + nkv) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(func);
        for p in &ptrs {
            b.arg(p);
        }
        b.arg(&nh32).arg(&nkv32).arg(&num_slots).arg(&eps32);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// `silu(gate) * up` of a `[rows, 2 * inter]` gate|up matrix: `[rows, inter]`.
    pub fn silu_mul(&self, gu: &Tensor) -> Result<Tensor> {
        let (rows, two_i) = gu.dims2()?;
        let out = self.alloc((rows, two_i / 2), self.dtype)?;
        self.silu_mul_into(gu, &out)?;
        Ok(out)
    }

    /// [`CudaKernels::silu_mul`] writing into `out` (`[rows, inter]`).
    pub fn silu_mul_into(&self, gu: &Tensor, out: &Tensor) -> Result<()> {
        self.check_dtype(gu)?;
        let (rows, two_i) = gu.dims2()?;
        let inter = two_i / 2;
        if out.elem_count() != rows * inter {
            return Err(kernel_err("silu_mul", "output of the wrong size"));
        }
        let (pg, po) = (self.ptr(gu)?, self.ptr(out)?);
        let (rows64, inter32) = (rows as i64, inter as i32);
        let n = rows * inter;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.silu_mul);
        b.arg(&pg).arg(&po).arg(&rows64).arg(&inter32);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// The index of the largest value of each row of f32 `[rows, n]` logits (ties: lowest).
    pub fn argmax(&self, logits: &Tensor) -> Result<Tensor> {
        if logits.dtype() != DType::F32 {
            return Err(kernel_err("argmax", "logits must be f32"));
        }
        let (rows, n) = logits.dims2()?;
        let out = self.alloc(rows, DType::U32)?;
        let (pl, po, n32) = (self.ptr(logits)?, self.ptr(&out)?, n as i32);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.argmax_f32);
        b.arg(&pl).arg(&po).arg(&n32);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { b.launch(cfg) }.w()?;
        Ok(out)
    }

    /// The `k` largest logits of each row of f32 `[rows, n]` logits and their token ids, in
    /// order (value descending, id ascending on ties): (`[rows, k]` f32, `[rows, k]` u32).
    pub fn topk(&self, logits: &Tensor, k: usize) -> Result<(Tensor, Tensor)> {
        if logits.dtype() != DType::F32 {
            return Err(kernel_err("topk", "logits must be f32"));
        }
        let (rows, n) = logits.dims2()?;
        let k = k.clamp(1, n.max(1));
        let vals = self.alloc((rows, k), DType::F32)?;
        let ids = self.alloc((rows, k), DType::U32)?;
        let (pl, pv, pi) = (self.ptr(logits)?, self.ptr(&vals)?, self.ptr(&ids)?);
        let (n32, k32) = (n as i32, k as i32);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.topk_f32);
        b.arg(&pl).arg(&n32).arg(&k32).arg(&pv).arg(&pi);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { b.launch(cfg) }.w()?;
        Ok((vals, ids))
    }

    /// Decode attention over the paged caches: q `[B, nh, 128]` (pre-scaled), block tables
    /// u32 `[B, W]`, context lengths u32 `[B]`. Returns `[B, nh * 128]`.
    pub fn paged_decode(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        block_tables: &Tensor,
        ctx_lens: &Tensor,
        block_size: usize,
    ) -> Result<Tensor> {
        let (b, nh, hd) = q.dims3()?;
        let out = self.alloc((b, nh * hd), self.dtype)?;
        let w = block_tables.dim(1)?;
        let scratch = self.decode_scratch(b, nh, w, block_size)?;
        self.paged_decode_into(
            q,
            k_cache,
            v_cache,
            block_tables,
            ctx_lens,
            block_size,
            &out,
            scratch.as_ref(),
        )?;
        Ok(out)
    }

    /// [`CudaKernels::paged_decode`] writing into `out` (a contiguous `[B, nh * 128]` view),
    /// with partials in `scratch` (from [`CudaKernels::decode_scratch`] for at least `B`
    /// sequences and this table width).
    #[allow(clippy::too_many_arguments)]
    pub fn paged_decode_into(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        block_tables: &Tensor,
        ctx_lens: &Tensor,
        block_size: usize,
        out: &Tensor,
        scratch: Option<&(Tensor, Tensor)>,
    ) -> Result<()> {
        self.check_dtype(q)?;
        let (b, nh, hd) = q.dims3()?;
        let (nkv, num_slots, _) = k_cache.dims3()?;
        let w = block_tables.dim(1)?;
        if hd != 128 || nkv == 0 || nh % nkv != 0 {
            return Err(kernel_err(
                "paged_decode",
                format!("nh {nh} nkv {nkv} hd {hd}"),
            ));
        }
        let func = match nh / nkv {
            1 => &self.decode[0],
            2 => &self.decode[1],
            4 => &self.decode[2],
            8 => &self.decode[3],
            g => return Err(kernel_err("paged_decode", format!("GQA group {g}"))),
        };
        let splits = (w * block_size).div_ceil(DECODE_PARTITION).max(1);
        let (acc, ml) = match scratch {
            _ if splits == 1 => (out.clone(), out.clone()),
            Some((a, m)) if a.elem_count() >= b * nh * splits * hd => (a.clone(), m.clone()),
            _ => return Err(kernel_err("paged_decode", "scratch missing or too small")),
        };
        let ptrs = [
            self.ptr(q)?,
            self.ptr(k_cache)?,
            self.ptr(v_cache)?,
            self.ptr(block_tables)?,
            self.ptr(ctx_lens)?,
            self.ptr(out)?,
            self.ptr(&acc)?,
            self.ptr(&ml)?,
        ];
        let (w32, bs32, slots64, nkv32, part32) = (
            w as i32,
            block_size as i32,
            num_slots as i64,
            nkv as i32,
            DECODE_PARTITION as i32,
        );
        let cfg = LaunchConfig {
            grid_dim: (b as u32, nkv as u32, splits as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut lb = self.stream.launch_builder(func);
        for p in &ptrs {
            lb.arg(p);
        }
        lb.arg(&w32)
            .arg(&bs32)
            .arg(&slots64)
            .arg(&nkv32)
            .arg(&part32);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { lb.launch(cfg) }.w()?;
        if splits > 1 {
            let (pa, pm, po, s32) = (ptrs[6], ptrs[7], ptrs[5], splits as i32);
            let cfg = LaunchConfig {
                grid_dim: (b as u32, nh as u32, 1),
                block_dim: (hd as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut rb = self.stream.launch_builder(&self.decode_reduce);
            rb.arg(&pa).arg(&pm).arg(&po).arg(&s32);
            // SAFETY: as above.
            unsafe { rb.launch(cfg) }.w()?;
        }
        Ok(())
    }

    /// Whether a prefill kernel serves a GQA group of `g` query heads per KV head.
    pub fn prefill_supports(&self, g: usize) -> bool {
        match self.prefill_tc {
            Some(_) => matches!(g, 1 | 2 | 4 | 8),
            None => matches!(g, 1 | 2 | 4),
        }
    }

    /// Query tokens per prefill tile for a GQA group of `g` (the `tiles` the prefill kernel
    /// takes step by this): 64 query rows per block on tensor cores, 16 tokens otherwise.
    pub fn prefill_tile(&self, g: usize) -> usize {
        match self.prefill_tc {
            Some(_) => (64 / g.max(1)).max(1),
            None => PREFILL_TILE,
        }
    }

    /// Causal varlen attention of prefill chunks over the paged caches, written into the rows
    /// of `out` (`[T, nh * 128]`) that `seq_meta` names; on tensor cores for bf16. Tiles step
    /// by [`CudaKernels::prefill_tile`] query tokens. `tiles` u32 `[num_tiles * 2]` and
    /// `seq_meta` u32 `[S * 4]` are laid out as `kernels/attention.cu` says; `tables` holds
    /// the sequences' block tables back to back.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_prefill_into(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        tiles: &Tensor,
        seq_meta: &Tensor,
        tables: &Tensor,
        block_size: usize,
        out: &Tensor,
    ) -> Result<()> {
        self.check_dtype(q)?;
        let (_, nh, hd) = q.dims3()?;
        let (nkv, num_slots, _) = k_cache.dims3()?;
        let g = nh / nkv.max(1);
        let func = match (&self.prefill_tc, hd, nkv > 0 && nh % nkv == 0, g) {
            (Some(tc), 128, true, 1) => &tc[0],
            (Some(tc), 128, true, 2) => &tc[1],
            (Some(tc), 128, true, 4) => &tc[2],
            (Some(tc), 128, true, 8) => &tc[3],
            (None, 128, true, 1) => &self.prefill[0],
            (None, 128, true, 2) => &self.prefill[1],
            (None, 128, true, 4) => &self.prefill[2],
            _ => {
                return Err(kernel_err(
                    "paged_prefill",
                    format!("nh {nh} nkv {nkv} hd {hd}"),
                ));
            }
        };
        let num_tiles = tiles.elem_count() / 2;
        if num_tiles == 0 {
            return Ok(());
        }
        let ptrs = [
            self.ptr(q)?,
            self.ptr(k_cache)?,
            self.ptr(v_cache)?,
            self.ptr(tiles)?,
            self.ptr(seq_meta)?,
            self.ptr(tables)?,
            self.ptr(out)?,
        ];
        let (bs32, slots64, nkv32) = (block_size as i32, num_slots as i64, nkv as i32);
        let cfg = LaunchConfig {
            grid_dim: (num_tiles as u32, nkv as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(func);
        for p in &ptrs {
            b.arg(p);
        }
        b.arg(&bs32).arg(&slots64).arg(&nkv32);
        // SAFETY: argument types match the kernel's signature; the metadata was built for
        // these caches and `out`.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// Rows `ids` (u32 `[T]`) of an embedding table `[V, H]`: `[T, H]`.
    pub fn embedding(&self, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
        self.rows_of(&self.embedding, table, ids)
    }

    /// Rows `rows` (u32 `[R]`) of a `[T, H]` matrix: `[R, H]`.
    pub fn gather_rows(&self, x: &Tensor, rows: &Tensor) -> Result<Tensor> {
        self.rows_of(&self.gather_rows, x, rows)
    }

    fn rows_of(&self, func: &CudaFunction, x: &Tensor, rows: &Tensor) -> Result<Tensor> {
        self.check_dtype(x)?;
        let (_, n) = x.dims2()?;
        let r = rows.elem_count();
        let out = self.alloc((r, n), self.dtype)?;
        if r == 0 {
            return Ok(out);
        }
        let (px, pr, po, n32) = (self.ptr(x)?, self.ptr(rows)?, self.ptr(&out)?, n as i32);
        let cfg = LaunchConfig {
            grid_dim: (r as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(func);
        b.arg(&px).arg(&pr).arg(&po).arg(&n32);
        // SAFETY: argument types match the kernel's signature; row ids are checked by the
        // caller (token ids against the vocabulary, row ids against the batch).
        unsafe { b.launch(cfg) }.w()?;
        Ok(out)
    }

    /// An f32 copy of `x` (same shape).
    pub fn to_f32(&self, x: &Tensor) -> Result<Tensor> {
        if x.dtype() == DType::F32 {
            return Ok(x.clone());
        }
        self.check_dtype(x)?;
        let n = x.elem_count();
        let out = self.alloc(x.shape().clone(), DType::F32)?;
        let (px, po, n64) = (self.ptr(x)?, self.ptr(&out)?, n as i64);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.to_f32);
        b.arg(&px).arg(&po).arg(&n64);
        // SAFETY: argument types match the kernel's signature.
        unsafe { b.launch(cfg) }.w()?;
        Ok(out)
    }

    /// `parts` (contiguous, same dtype and trailing shape) stacked along dim 0, by device
    /// copies (no kernel to compile).
    pub fn cat_rows(&self, parts: &[Tensor]) -> Result<Tensor> {
        let first = parts
            .first()
            .ok_or_else(|| kernel_err("cat_rows", "no parts"))?;
        let dtype = first.dtype();
        let mut dims = first.dims().to_vec();
        dims[0] = parts
            .iter()
            .map(|p| p.dim(0))
            .sum::<candle_core::Result<usize>>()?;
        let out = self.alloc(dims, dtype)?;
        let mut at = self.ptr(&out)?;
        for p in parts {
            let bytes = p.elem_count() * dtype.size_in_bytes();
            let src = self.ptr(p)?;
            // SAFETY: `out` holds the sum of the parts' sizes; the copies do not overlap.
            unsafe {
                candle_core::cuda_backend::cudarc::driver::result::memcpy_dtod_async(
                    at,
                    src,
                    bytes,
                    self.stream.cu_stream(),
                )
            }
            .map_err(|e| kernel_err("cat_rows", e))?;
            at += bytes as u64;
        }
        Ok(out)
    }
}

impl CudaKernels {
    /// The kernels for a model, or `None` where the candle path serves it: not on CUDA, a
    /// dtype other than bf16/f32, a head_dim other than 128, or `POLICY_SERVE_KERNELS=0`.
    pub fn for_model(
        cfg: &super::ModelConfig,
        device: &Device,
        dtype: DType,
    ) -> Result<Option<Self>> {
        if std::env::var("POLICY_SERVE_KERNELS").is_ok_and(|v| v == "0") {
            tracing::info!("POLICY_SERVE_KERNELS=0: the forward runs candle ops");
            return Ok(None);
        }
        if cfg.head_dim() != 128 {
            return Ok(None);
        }
        Self::new(device, dtype)
    }
}
