//! The 1-row plain skinny matmul with its weights streamed into shared memory by the copy
//! engine (`kernels/gemv_tma_sm90.cu`, `LaunchOptions::gemv_tma`, sm_90): one block per SM of
//! 8 compute warps and a copy warp whose lanes keep each compute warp's ring of 2 KB weight
//! pieces full, from before the wait on the kernel before. The same sums in the same order as
//! the skinny matmuls of `kernels/gemv.cu` (the same bits). With `LaunchOptions::gemv_tma_head`
//! it takes a 1-row step's lm_head too, and with `gemv_tma_head_argmax` a greedy graph's head
//! in one launch (the f32 logits and their argmax, `gemv_tma_argmax`).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};

use super::handles::TMA_GEMV_MAX_SMEM;
use super::kernels::CudaKernels;
use super::launch::kernel_err;
use super::logits_ops::GreedyScratch;
use crate::error::Result;

/// Inputs a weight piece holds (2 KB of bf16); K must be a multiple.
const PIECE: usize = 1024;
/// The matmuls it serves: 1 row, at least `LaunchOptions::gemv_tma_min_k` inputs (by default
/// 2,048) and at most `MAX_K`, a multiple of [`PIECE`], and `ROWS` outputs (any with
/// `LaunchOptions::gemv_tma_any_rows`): 0.6B's down (1,024 x 3,072) and o (1,024 x 2,048). On
/// the H200 0.6B batch 1 gained 3.3% with the down on it and 3.0% more with o, while 1.7B lost
/// 1.2% with its down (2,048 x 6,144; the kernel alone 8.9 against 9.3 us) and 1.1% with its o
/// (2,048 x 2,048), and the 30B-A3B shape 2.2% with its router (128 x 2,048; BENCHMARKS.md,
/// #21): only 1,024-row weights were measured faster.
const MAX_K: usize = 4096;
const ROWS: usize = 1024;

/// Fewest outputs a weight must have to count as an lm_head (`LaunchOptions::gemv_tma_head`):
/// more than the skinny matmuls take.
const HEAD_MIN_ROWS: usize = (1 << 15) + 1;

impl CudaKernels {
    /// The ring slots a warp when the streamed kernel serves a matmul of `t` rows of `k`
    /// inputs and `n` outputs, and the shared memory that takes; None when it does not.
    fn tma_serves(&self, t: usize, (n, k): (usize, usize)) -> Option<(usize, usize)> {
        let g = self.gemv_tma.as_ref()?;
        let shape = t == 1 && n > 0 && k <= MAX_K && k.is_multiple_of(PIECE);
        let slots = match g.head {
            Some(s) if n >= HEAD_MIN_ROWS => s,
            _ if k >= g.min_k && (g.any_rows || n == ROWS) => g.slots,
            _ => return None,
        };
        // The rings (8 warps) and the input row.
        let smem = 8 * slots * PIECE * 2 + k * 2;
        (shape && smem <= TMA_GEMV_MAX_SMEM && self.gemv.is_some()).then_some((slots, smem))
    }

    /// `out[0] = x[0] · wᵀ` on the streamed kernel when it serves the shape (`t` rows of `k`
    /// inputs, `n` outputs) and the skinny matmuls are on; false (nothing launched) when not.
    pub(super) fn gemv_tma_into(
        &self,
        t: usize,
        (n, k): (usize, usize),
        (pw, px, po): (u64, u64, u64),
    ) -> Result<bool> {
        let (Some(g), Some((slots, smem))) = (self.gemv_tma.as_ref(), self.tma_serves(t, (n, k)))
        else {
            return Ok(false);
        };
        let (n32, k32, ns) = (n as i32, k as i32, slots as i32);
        let mut b = self.launcher(&g.f);
        b.arg(&pw).arg(&px).arg(&po).arg(&n32).arg(&k32).arg(&ns);
        // SAFETY: the arguments match `gemv_tma` in kernels/gemv_tma_sm90.cu; the caller
        // checked the shapes (w `[n, k]`, x `[1, k]`, out `[1, n]`, contiguous bf16); k is a
        // multiple of 1,024 and the shared memory within the attribute set at load.
        unsafe { b.launch(self.tma_config(smem)) }.map_err(|e| kernel_err("gemv_tma", e))?;
        Ok(true)
    }

    /// A greedy 1-row step's head in one launch (`LaunchOptions::gemv_tma_head_argmax`):
    /// `logits` (f32 `[1, n]`) = x · wᵀ rounded to bf16, as [`Self::linear_into`] then
    /// [`Self::to_f32_into`] give them on the streamed kernel, and `ids[0]` (and `feed[0]`)
    /// their argmax, as [`Self::to_f32_argmax_into`] takes it; `scratch` from
    /// [`Self::greedy_scratch`]. False (nothing launched) when the kernel is not loaded or does
    /// not serve the shape: the caller then runs those two.
    pub fn lm_head_argmax_into(
        &self,
        x: &Tensor,
        w: &Tensor,
        logits: &Tensor,
        (ids, feed): (&Tensor, Option<&Tensor>),
        scratch: &GreedyScratch,
    ) -> Result<bool> {
        let Some(f) = self.gemv_tma.as_ref().and_then(|g| g.argmax.as_ref()) else {
            return Ok(false);
        };
        self.check_dtype(x)?;
        self.check_dtype(w)?;
        let (n, k) = w.dims2()?;
        let t = x.elem_count() / k.max(1);
        let Some((slots, smem)) = self.tma_serves(t, (n, k)).filter(|_| n >= HEAD_MIN_ROWS) else {
            return Ok(false);
        };
        let (values, indices, counters) = scratch.parts();
        let fits = x.dim(candle_core::D::Minus1)? == k
            && logits.dtype() == DType::F32
            && logits.elem_count() == n
            && ids.dtype() == DType::U32
            && ids.elem_count() == 1
            && feed.is_none_or(|f| f.dtype() == DType::U32 && f.elem_count() == 1)
            && values.elem_count() >= self.sms
            && counters.elem_count() >= 1;
        if !fits {
            return Err(kernel_err(
                "gemv_tma_argmax",
                "buffers of the wrong size or dtype",
            ));
        }
        let (pw, px, po) = (self.ptr(w)?, self.ptr(x)?, self.ptr(logits)?);
        let (pv, pi, pc) = (self.ptr(values)?, self.ptr(indices)?, self.ptr(counters)?);
        let pid = self.ptr(ids)?;
        let pf = feed.map(|f| self.ptr(f)).transpose()?.unwrap_or(0);
        let (n32, k32, ns) = (n as i32, k as i32, slots as i32);
        let mut b = self.launcher(f);
        b.arg(&pw).arg(&px).arg(&po).arg(&n32).arg(&k32).arg(&ns);
        b.arg(&pv).arg(&pi).arg(&pc).arg(&pid).arg(&pf);
        // SAFETY: the arguments match `gemv_tma_argmax` in kernels/gemv_tma_sm90.cu; the shapes
        // and buffers are checked above (a best a block: the grid is one block an SM), k is a
        // multiple of 1,024 and the shared memory within the attribute set at load; the
        // counter is zero between launches (the last block resets it).
        unsafe { b.launch(self.tma_config(smem)) }.map_err(|e| kernel_err("gemv_tma_argmax", e))?;
        Ok(true)
    }

    /// One block an SM of 8 compute warps and the copy warp.
    fn tma_config(&self, smem: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.sms as u32, 1, 1),
            block_dim: (288, 1, 1),
            shared_mem_bytes: smem as u32,
        }
    }
}
