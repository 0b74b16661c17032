//! Launches of the per-layer kernels (`kernels/layer_ops.cu`, the KV write
//! `kernels/kv_write.cu`): fused add+RMSNorm, q/k norm + RoPE + KV write, SiLU*up, row gather
//! (embedding), f32 cast, and weight stacking by device copies. What a step does with its logits is `logits_ops.rs`.

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, LaunchConfig};
use candle_core::{DType, Tensor};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::engine::kv_format::KvRef;
use crate::error::Result;

impl CudaKernels {
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
        self.add_rmsnorm_to(x, residual, residual, w, eps, out)
    }

    /// [`CudaKernels::add_rmsnorm_into`] with the sum written to `res_out` (which may be
    /// `residual` itself); without `x` nothing is written there.
    pub fn add_rmsnorm_to(
        &self,
        x: Option<&Tensor>,
        residual: &Tensor,
        res_out: &Tensor,
        w: &Tensor,
        eps: f64,
        out: &Tensor,
    ) -> Result<()> {
        self.check_dtype(residual)?;
        let n = residual.dim(candle_core::D::Minus1)?;
        let rows = residual.elem_count() / n.max(1);
        if out.elem_count() != residual.elem_count()
            || res_out.elem_count() != residual.elem_count()
        {
            return Err(kernel_err("add_rmsnorm", "output of the wrong size"));
        }
        let (pr, pro) = (self.ptr(residual)?, self.ptr(res_out)?);
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
        let mut b = self.launcher(&self.add_rmsnorm);
        // res_in and res_out may be the same buffer: each element is read, then written, by
        // the same thread.
        b.arg(&px).arg(&pr).arg(&pro).arg(&pw).arg(&po);
        b.arg(&n32).arg(&eps32).arg(&add);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
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
        kv: KvRef<'_>,
        (nh, nkv, hd): (usize, usize, usize),
        eps: f64,
    ) -> Result<Tensor> {
        let q = self.alloc((qkv.dim(0)?, nh, hd), self.dtype)?;
        self.qk_norm_rope_kv_write_into(
            qkv,
            (q_w, k_w),
            inv_freq,
            (positions, slots),
            kv,
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
        kv: KvRef<'_>,
        (nh, nkv, hd): (usize, usize, usize),
        eps: f64,
        q: &Tensor,
    ) -> Result<()> {
        let (k_cache, v_cache) = (kv.k, kv.v);
        self.check_dtype(qkv)?;
        let t = qkv.dim(0)?;
        if q.elem_count() != t * nh * hd {
            return Err(kernel_err("qk_norm_rope", "q output of the wrong size"));
        }
        let func = match hd {
            128 if kv.is_fp8() => &self.fp8_kernels("qk_norm_rope")?.kv_write,
            128 => &self.qk_rope_hd128,
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
            block_dim: (32 * (nh + nkv).min(32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(func);
        for p in &ptrs {
            b.arg(p);
        }
        b.arg(&nh32).arg(&nkv32).arg(&num_slots).arg(&eps32);
        // The fp8 kernel takes the layer's scales after the others, then where the rows go
        // unrounded (0: nowhere).
        let (ks, vs) = (kv.scale.k, kv.scale.v);
        let fresh = match kv.fresh {
            Some((k, v)) => [self.ptr(k)?, self.ptr(v)?],
            None => [0, 0],
        };
        if kv.is_fp8() {
            b.arg(&ks).arg(&vs).arg(&fresh[0]).arg(&fresh[1]);
        }
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
        let mut b = self.launcher(&self.silu_mul);
        b.arg(&pg).arg(&po).arg(&rows64).arg(&inter32);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// Rows `ids` (u32 `[T]`) of an embedding table `[V, H]`, into `out` (`[T, H]`): the same
    /// row gather as [`CudaKernels::gather_rows`].
    pub fn embedding_into(&self, table: &Tensor, ids: &Tensor, out: &Tensor) -> Result<()> {
        self.gather_rows_into(table, ids, out)
    }

    /// Rows `rows` (u32 `[R]`) of a `[T, H]` matrix: `[R, H]`.
    pub fn gather_rows(&self, x: &Tensor, rows: &Tensor) -> Result<Tensor> {
        let out = self.alloc((rows.elem_count(), x.dim(1)?), self.dtype)?;
        self.gather_rows_into(x, rows, &out)?;
        Ok(out)
    }

    fn gather_rows_into(&self, x: &Tensor, rows: &Tensor, out: &Tensor) -> Result<()> {
        self.check_dtype(x)?;
        self.gather_with(&self.gather_rows, x, rows, out)
    }

    /// The row gather of `kernels/layer_ops.cu` (`gather_rows_bf16` / `_f32`: `f`, the one for
    /// `x`'s dtype) of rows `rows` of `x` into `out`.
    pub(super) fn gather_with(
        &self,
        f: &CudaFunction,
        x: &Tensor,
        rows: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let (_, n) = x.dims2()?;
        let r = rows.elem_count();
        if out.elem_count() != r * n {
            return Err(kernel_err("gather rows", "output of the wrong size"));
        }
        if r == 0 {
            return Ok(());
        }
        let (px, pr, po, n32, r32) = (
            self.ptr(x)?,
            self.ptr(rows)?,
            self.ptr(out)?,
            n as i32,
            r as i32,
        );
        let cfg = LaunchConfig {
            // Chunks of 256 elements of a row (at most 1,024 blocks a row), rows at most
            // 65,535 at once (the kernel strides both).
            grid_dim: (
                n.div_ceil(256).clamp(1, 1024) as u32,
                r.min(65_535) as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(f);
        b.arg(&px).arg(&pr).arg(&po).arg(&n32).arg(&r32);
        // SAFETY: argument types match the kernel's signature; row ids are checked by the
        // caller (token ids against the vocabulary, row ids against the batch).
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// An f32 copy of `x` (same shape).
    pub fn to_f32(&self, x: &Tensor) -> Result<Tensor> {
        if x.dtype() == DType::F32 {
            return Ok(x.clone());
        }
        let out = self.alloc(x.shape().clone(), DType::F32)?;
        self.to_f32_into(x, &out)?;
        Ok(out)
    }

    /// [`CudaKernels::to_f32`] into `out` (f32, as many elements as `x`).
    pub fn to_f32_into(&self, x: &Tensor, out: &Tensor) -> Result<()> {
        self.check_dtype(x)?;
        let n = x.elem_count();
        if out.dtype() != DType::F32 || out.elem_count() != n {
            return Err(kernel_err("to_f32", "output of the wrong size or dtype"));
        }
        let (px, po, n64) = (self.ptr(x)?, self.ptr(out)?, n as i64);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&self.to_f32);
        b.arg(&px).arg(&po).arg(&n64);
        // SAFETY: argument types match the kernel's signature.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
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
