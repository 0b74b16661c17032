//! Launches of the per-layer and sampling kernels (`kernels/layer_ops.cu`): fused
//! add+RMSNorm, q/k norm + RoPE + KV write, SiLU*up, argmax, top-k, row gather (embedding),
//! f32 cast, and weight stacking by device copies.

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
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

    /// The index of the largest value of each row of f32 `[rows, n]` logits (ties: lowest).
    /// Long rows (a vocabulary) are split over 32 blocks each, then merged.
    pub fn argmax(&self, logits: &Tensor) -> Result<Tensor> {
        if logits.dtype() != DType::F32 {
            return Err(kernel_err("argmax", "logits must be f32"));
        }
        let (rows, n) = logits.dims2()?;
        let out = self.alloc(rows, DType::U32)?;
        if rows == 0 {
            return Ok(out);
        }
        let parts = if n >= 32 * 1024 { 32usize } else { 1 };
        let (pv, pi) = (
            self.alloc(rows * parts, DType::F32)?,
            self.alloc(rows * parts, DType::U32)?,
        );
        let (pl, po, n32) = (self.ptr(logits)?, self.ptr(&out)?, n as i32);
        let (ppv, ppi) = (self.ptr(&pv)?, self.ptr(&pi)?);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, parts as u32, 1),
            block_dim: (if parts == 1 { 1024 } else { 256 }, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&self.argmax_f32);
        b.arg(&pl).arg(&po).arg(&n32).arg(&ppv).arg(&ppi);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { b.launch(cfg) }.w()?;
        if parts > 1 {
            let cfg = LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            };
            let parts32 = parts as i32;
            let mut b = self.launcher(&self.argmax_merge);
            b.arg(&ppv).arg(&ppi).arg(&parts32).arg(&po);
            // SAFETY: as above; the partials were written by the launch before, on this stream.
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok(out)
    }

    /// vLLM's repetition penalty on f32 logits in place: flat entries `at` (u32 `[m]`,
    /// distinct, each below the logits' size: the caller's to check) divided by `p` (f32
    /// `[m]`) when positive, multiplied otherwise.
    pub fn repetition_penalty(&self, logits: &Tensor, at: &Tensor, p: &Tensor) -> Result<()> {
        if logits.dtype() != DType::F32 || p.dtype() != DType::F32 {
            return Err(kernel_err("repetition penalty", "logits and p must be f32"));
        }
        let m = at.elem_count();
        if p.elem_count() != m {
            return Err(kernel_err(
                "repetition penalty",
                "at and p differ in length",
            ));
        }
        if m == 0 {
            return Ok(());
        }
        let (pl, pa, pp, m32) = (self.ptr(logits)?, self.ptr(at)?, self.ptr(p)?, m as i32);
        let cfg = LaunchConfig {
            grid_dim: (m.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&self.repetition_penalty);
        b.arg(&pl).arg(&pa).arg(&pp).arg(&m32);
        // SAFETY: argument types match the kernel's signature; `at` is checked by the caller.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// Rows `rows` (u32 `[R]`) of f32 `[T, n]` logits: `[R, n]`.
    pub fn gather_rows_f32(&self, x: &Tensor, rows: &Tensor) -> Result<Tensor> {
        if x.dtype() != DType::F32 {
            return Err(kernel_err("gather rows f32", "x must be f32"));
        }
        let (_, n) = x.dims2()?;
        let r = rows.elem_count();
        let out = self.alloc((r, n), DType::F32)?;
        if r == 0 {
            return Ok(out);
        }
        let (px, pr, po, n32) = (self.ptr(x)?, self.ptr(rows)?, self.ptr(&out)?, n as i32);
        let cfg = LaunchConfig {
            grid_dim: (r as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&self.gather_rows_f32);
        b.arg(&px).arg(&pr).arg(&po).arg(&n32);
        // SAFETY: argument types match the kernel's signature; row ids are the caller's to
        // check (rows of this step).
        unsafe { b.launch(cfg) }.w()?;
        Ok(out)
    }

    /// Log-probabilities of drawn tokens in one pass a row: for each `j`, row `rows[j]` of
    /// f32 `[R, n]` logits scaled by `inv_t[j]` (u32 and f32 `[m]`): its log-sum-exp and the
    /// log-softmax at the token drawn from that row, `ids[rows[j]]` (u32 `[R]`, the draw's
    /// output), as f32 `[m, 2]`. Row and token ids are the caller's to check (rows of this
    /// step, tokens drawn from them).
    pub fn logprob_rows(
        &self,
        logits: &Tensor,
        rows: &Tensor,
        inv_t: &Tensor,
        ids: &Tensor,
    ) -> Result<Tensor> {
        if logits.dtype() != DType::F32 || inv_t.dtype() != DType::F32 {
            return Err(kernel_err("logprob rows", "logits and inv_t must be f32"));
        }
        let (r, n) = logits.dims2()?;
        let m = rows.elem_count();
        if inv_t.elem_count() != m || ids.elem_count() != r || ids.dtype() != DType::U32 {
            return Err(kernel_err(
                "logprob rows",
                "inv_t must have one value a row asked for, ids (u32) one a logits row",
            ));
        }
        let out = self.alloc((m, 2), DType::F32)?;
        if m == 0 {
            return Ok(out);
        }
        let (pl, pr, pt, pc, po) = (
            self.ptr(logits)?,
            self.ptr(rows)?,
            self.ptr(inv_t)?,
            self.ptr(ids)?,
            self.ptr(&out)?,
        );
        let n32 = n as i32;
        let cfg = LaunchConfig {
            grid_dim: (m as u32, 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&self.logprob_rows);
        b.arg(&pl).arg(&n32).arg(&pr).arg(&pt).arg(&pc).arg(&po);
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
        let mut b = self.launcher(&self.topk_f32);
        b.arg(&pl).arg(&n32).arg(&k32).arg(&pv).arg(&pi);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { b.launch(cfg) }.w()?;
        Ok((vals, ids))
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
        let (_, n) = x.dims2()?;
        let r = rows.elem_count();
        if out.elem_count() != r * n {
            return Err(kernel_err("gather rows", "output of the wrong size"));
        }
        if r == 0 {
            return Ok(());
        }
        let (px, pr, po, n32) = (self.ptr(x)?, self.ptr(rows)?, self.ptr(out)?, n as i32);
        let cfg = LaunchConfig {
            grid_dim: (r as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&self.gather_rows);
        b.arg(&px).arg(&pr).arg(&po).arg(&n32);
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

    /// One token per row of f32 `logits` drawn from the whole vocabulary (no top-k or
    /// top-p): the inverse CDF of softmax(logits / t) at the row's uniform, walked in token-id
    /// order (`kernels/layer_ops.cu`, `sample_full_f32`). `params` as for [`Self::sample`];
    /// a k of 1 marks a greedy row (its argmax).
    pub fn sample_full(&self, logits: &Tensor, params: &[f32]) -> Result<Tensor> {
        let (rows, n) = logits.dims2()?;
        if params.len() != rows * 4 {
            return Err(kernel_err("sample_full", "params must be 4 per row"));
        }
        let out = self.alloc(rows, DType::U32)?;
        if rows == 0 {
            return Ok(out);
        }
        let p = Tensor::new(params, logits.device())?;
        let (pl, pp, po, n32) = (self.ptr(logits)?, self.ptr(&p)?, self.ptr(&out)?, n as i32);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&self.sample_full);
        b.arg(&pl).arg(&n32).arg(&pp).arg(&po);
        // SAFETY: argument types match the kernel's signature; buffers are sized above and
        // the logits are contiguous f32 [rows, n].
        unsafe { b.launch(cfg) }.w()?;
        Ok(out)
    }

    /// Draws one token per row of f32 `[rows, vocab]` logits on the device: the top `k`
    /// candidates, then temperature / top-k / top-p and the row's uniform number, as the host
    /// sampler does. `params` holds per row temperature, top_p, u, top_k (`[rows * 4]`); the
    /// chosen ids are left on the device (u32 `[rows]`).
    pub fn sample(&self, logits: &Tensor, k: usize, params: &[f32]) -> Result<Tensor> {
        let (rows, _) = logits.dims2()?;
        if params.len() != rows * 4 || k == 0 || k > 64 {
            return Err(kernel_err(
                "sample",
                "params must be 4 per row and 1 <= k <= 64",
            ));
        }
        let (vals, ids) = self.topk(logits, k)?;
        let k = vals.dim(1)?;
        let p = Tensor::new(params, logits.device())?;
        let out = self.alloc(rows, DType::U32)?;
        let ptrs = [self.ptr(&vals)?, self.ptr(&ids)?, self.ptr(&p)?];
        let (k32, rows32, po) = (k as i32, rows as i32, self.ptr(&out)?);
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(64) as u32, 1, 1),
            block_dim: (64, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&self.sample_topk);
        b.arg(&ptrs[0]).arg(&ptrs[1]).arg(&ptrs[2]);
        b.arg(&k32).arg(&rows32).arg(&po);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { b.launch(cfg) }.w()?;
        Ok(out)
    }
}
