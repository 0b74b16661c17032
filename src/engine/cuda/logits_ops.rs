//! Launches of the kernels a step runs on its logits: argmax, top-k, the draws (top-k and
//! whole-vocabulary), the log-probs of the drawn tokens and the gather of logits rows
//! (`kernels/layer_ops.cu`), and the in-place edits before them, the repetition penalty and
//! grammar masks (`kernels/logit_edits.cu`).

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::error::Result;

/// Partials of the argmax kernels: at least two blocks an SM over `rows` rows of `n` entries
/// for long rows (a vocabulary's row in 264 parts of ~576 entries at batch 1 on the H200: one
/// round of loads a thread), one block a row otherwise.
fn argmax_parts(sms: usize, rows: usize, n: usize) -> usize {
    if n >= 32 * 1024 {
        (2 * sms).div_ceil(rows.max(1)).clamp(32, 512)
    } else {
        1
    }
}

/// The buffers of [`CudaKernels::to_f32_argmax_into`] for up to `rows` rows: each block's best
/// value and index, and a counter a row (zero between launches).
pub struct GreedyScratch {
    values: Tensor,
    indices: Tensor,
    counters: Tensor,
}

impl GreedyScratch {
    /// The blocks' best values and indices and the rows' counters.
    pub(super) fn parts(&self) -> (&Tensor, &Tensor, &Tensor) {
        (&self.values, &self.indices, &self.counters)
    }
}

impl CudaKernels {
    /// Whether rows sampled over the whole vocabulary are drawn on the device.
    pub fn samples_full(&self) -> bool {
        self.sample_full_on
    }

    /// Whether the decode graphs compute the greedy tokens with the f32 logits
    /// (`LaunchOptions::graph_argmax`).
    pub fn graph_argmax(&self) -> bool {
        self.to_f32_argmax.is_some()
    }

    /// Whether the decode graphs' argmax also writes the graph's input ids
    /// (`LaunchOptions::graph_feed`, with `graph_argmax`).
    pub fn graph_feed(&self) -> bool {
        // (Set only with `graph_argmax`, which is what loads `to_f32_argmax`.)
        self.graph_feed
    }

    /// The buffers [`Self::to_f32_argmax_into`] needs for steps of up to `rows` rows of `n`
    /// logits.
    pub fn greedy_scratch(&self, rows: usize, n: usize) -> Result<GreedyScratch> {
        let most = (1..=rows.max(1))
            .map(|r| r * argmax_parts(self.sms, r, n))
            .max()
            .unwrap_or(1);
        Ok(GreedyScratch {
            values: self.alloc(most, DType::F32)?,
            indices: self.alloc(most, DType::U32)?,
            counters: self.decode_counters(rows, 1)?,
        })
    }

    /// `out = x` in f32 (`[rows, n]`, as [`Self::to_f32_into`]) and `ids[r]` = row r's
    /// argmax of it, as [`Self::argmax`] gives it, in one launch (`layer_ops.cu`
    /// `to_f32_argmax_*`); `scratch` from [`Self::greedy_scratch`] for at least `rows` rows.
    /// `feed` (u32 `[rows]`, e.g. a decode graph's input ids) gets the same ids too.
    /// An error when the kernel is not loaded (`LaunchOptions::graph_argmax` off).
    pub fn to_f32_argmax_into(
        &self,
        x: &Tensor,
        out: &Tensor,
        (ids, feed): (&Tensor, Option<&Tensor>),
        scratch: &GreedyScratch,
    ) -> Result<()> {
        let f = (self.to_f32_argmax.as_ref())
            .ok_or_else(|| kernel_err("to_f32_argmax", "not loaded (graph_argmax off)"))?;
        self.check_dtype(x)?;
        let (rows, n) = x.dims2()?;
        let parts = argmax_parts(self.sms, rows, n);
        let fits = out.dtype() == DType::F32
            && out.elem_count() == rows * n
            && ids.dtype() == DType::U32
            && ids.elem_count() == rows
            && feed.is_none_or(|f| f.dtype() == DType::U32 && f.elem_count() == rows)
            && scratch.counters.elem_count() >= rows
            && scratch.values.elem_count() >= rows * parts;
        if !fits {
            return Err(kernel_err(
                "to_f32_argmax",
                "buffers of the wrong size or dtype",
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        let (px, po, pid, n32) = (self.ptr(x)?, self.ptr(out)?, self.ptr(ids)?, n as i32);
        let (pv, pi) = (self.ptr(&scratch.values)?, self.ptr(&scratch.indices)?);
        let pc = self.ptr(&scratch.counters)?;
        let pf = match feed {
            Some(f) => self.ptr(f)?,
            None => 0u64,
        };
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, parts as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(f);
        b.arg(&px)
            .arg(&po)
            .arg(&n32)
            .arg(&pv)
            .arg(&pi)
            .arg(&pc)
            .arg(&pid)
            .arg(&pf);
        // SAFETY: argument types match `to_f32_argmax_*`; the buffers are sized above and the
        // counters are zero between launches (the kernel's last block a row resets its own).
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
        let parts = argmax_parts(self.sms, rows, n);
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
                block_dim: (parts.next_multiple_of(32).min(256) as u32, 1, 1),
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

    /// A grammar's masks on f32 `[T, vocab]` logits in place. `spec` (u32 `[3 * n]`: rows,
    /// then forced tokens, then mask indices, `n` each) says for entry `m`: row `rows[m]`
    /// (below `T`: the caller's to check) keeps token `forced[m]` alone when that is a token id
    /// (below `vocab`), else the tokens mask `at[m]` of `masks` allows (u32 `[K, words]`, bit
    /// `t % 32` of word `t / 32` set: token `t` allowed; `at[m] < K`). Disallowed tokens
    /// become -inf.
    pub fn mask_tokens(&self, logits: &Tensor, masks: &Tensor, spec: &Tensor) -> Result<()> {
        if logits.dtype() != DType::F32 || masks.dtype() != DType::U32 {
            return Err(kernel_err(
                "mask tokens",
                "logits must be f32 and masks u32",
            ));
        }
        let (_, vocab) = logits.dims2()?;
        let (_, words) = masks.dims2()?;
        let n = spec.elem_count() / 3;
        if words * 32 < vocab || spec.elem_count() != 3 * n || spec.dtype() != DType::U32 {
            return Err(kernel_err(
                "mask tokens",
                "masks must cover the vocabulary, the spec three u32 a row",
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let (pl, pm, ps) = (self.ptr(logits)?, self.ptr(masks)?, self.ptr(spec)?);
        let (n32, v32, w32) = (n as i32, vocab as i32, words as i32);
        let cfg = LaunchConfig {
            grid_dim: (vocab.div_ceil(256) as u32, n as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&self.mask_tokens);
        b.arg(&pl).arg(&pm).arg(&ps).arg(&n32).arg(&v32).arg(&w32);
        // SAFETY: argument types match the kernel's signature; shapes are checked above and
        // the rows, forced tokens and mask indices by the caller.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// Rows `rows` (u32 `[R]`) of f32 `[T, n]` logits: `[R, n]` (row ids are the caller's to
    /// check: rows of this step).
    pub fn gather_rows_f32(&self, x: &Tensor, rows: &Tensor) -> Result<Tensor> {
        if x.dtype() != DType::F32 {
            return Err(kernel_err("gather rows f32", "x must be f32"));
        }
        let out = self.alloc((rows.elem_count(), x.dim(1)?), DType::F32)?;
        self.gather_with(&self.gather_rows_f32, x, rows, &out)?;
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
