//! The 1-row skinny matmuls with their weights streamed into shared memory by the copy engine
//! (`kernels/gemv_tma_sm90.cu`, `LaunchOptions::gemv_tma`, `gemv_tma_norm`,
//! `gemv_tma_norm_silu`; sm_90): one block per SM of 8 compute warps and a copy warp whose
//! lanes keep each compute warp's ring of 2 KB weight pieces full, from before the wait on the
//! kernel before. The same sums in the same order as the skinny matmuls of `kernels/gemv.cu`
//! (the same bits), behind the same fused add+RMSNorm for the norm kinds.

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use super::tma_handle::TMA_GEMV_MAX_SMEM;
use crate::error::Result;

/// Inputs a weight piece holds (2 KB of bf16); K must be a multiple.
const PIECE: usize = 1024;
/// The plain matmuls it serves: 1 row, at least `LaunchOptions::gemv_tma_min_k` inputs (by
/// default 2,048) and at most `MAX_K`, a multiple of [`PIECE`], and `ROWS` outputs (any with
/// `LaunchOptions::gemv_tma_any_rows`): 0.6B's down (1,024 x 3,072) and o (1,024 x 2,048). On
/// the H200 0.6B batch 1 gained 3.3% with the down on it and 3.0% more with o, while 1.7B lost
/// 1.2% with its down (2,048 x 6,144; the kernel alone 8.9 against 9.3 us) and 1.1% with its o
/// (2,048 x 2,048), and the 30B-A3B shape 2.2% with its router (128 x 2,048; BENCHMARKS.md,
/// #21): only 1,024-row weights were measured faster. The norm kinds take any row count of
/// 1,024-`MAX_K` inputs (the normed row lives in shared memory, as the norm weights in
/// registers: at most 16 a thread).
const MAX_K: usize = 4096;
const ROWS: usize = 1024;

/// The fused norm of a streamed matmul: the residual, its delta (None: normed as is), where
/// block 0 writes their sum, the norm weights and epsilon.
pub(super) type TmaNorm = (u64, Option<u64>, u64, u64, f32);

impl CudaKernels {
    /// `out[0] = x[0] · wᵀ` on the streamed kernel when it serves the shape (`t` rows of `k`
    /// inputs, `n` outputs) and the skinny matmuls are on; false (nothing launched) when not.
    pub(super) fn gemv_tma_into(
        &self,
        t: usize,
        (n, k): (usize, usize),
        (pw, px, po): (u64, u64, u64),
    ) -> Result<bool> {
        let Some(g) = self.gemv_tma.as_ref() else {
            return Ok(false);
        };
        let Some((f, slots)) = g.plain.as_ref() else {
            return Ok(false);
        };
        let rows = g.any_rows || n == ROWS;
        if !(t == 1 && k >= g.min_k && rows && self.tma_fits(n, k, *slots)) {
            return Ok(false);
        }
        let (n32, k32, ns) = (n as i32, k as i32, *slots as i32);
        let mut b = self.launcher(f);
        b.arg(&pw).arg(&px).arg(&po).arg(&n32).arg(&k32).arg(&ns);
        // SAFETY: the arguments match `gemv_tma` in kernels/gemv_tma_sm90.cu; the caller
        // checked the shapes (w `[n, k]`, x `[1, k]`, out `[1, n]`, contiguous bf16); k is a
        // multiple of 1,024 and the shared memory within the attribute set at load.
        unsafe { b.launch(self.tma_config(k, *slots)) }.map_err(|e| kernel_err("gemv_tma", e))?;
        Ok(true)
    }

    /// The 1-row matmul behind the fused add+RMSNorm (`silu`: the gate|up pairs with SiLU*up,
    /// `n` the pairs) on the streamed kernel when its option is on and it serves `k` inputs;
    /// `deferred`: the norm's scale on the sums (as the skinny matmuls' `dnorm_*` kernels).
    /// False (nothing launched) when not. The caller checked the shapes: w `[n, k]` (`[2n, k]`
    /// with silu), res, delta and res_out `[1, k]`, out `[1, n]`, contiguous bf16.
    pub(super) fn gemv_tma_norm_into(
        &self,
        (n, k, silu, deferred): (usize, usize, bool, bool),
        (pres, pdelta, pres_out, pnw, eps): TmaNorm,
        (pw, po): (u64, u64),
    ) -> Result<bool> {
        let Some(g) = self.gemv_tma.as_ref() else {
            return Ok(false);
        };
        let Some((fs, slots)) = (if silu { &g.norm_silu } else { &g.norm }).as_ref() else {
            return Ok(false);
        };
        if !self.tma_fits(n, k, *slots) {
            return Ok(false);
        }
        let (n32, k32, ns) = (n as i32, k as i32, *slots as i32);
        let (pd, add) = pdelta.map_or((pres, 0i32), |d| (d, 1));
        let mut b = self.launcher(&fs[usize::from(deferred)]);
        b.arg(&pw).arg(&pres).arg(&pd).arg(&pres_out).arg(&pnw);
        b.arg(&eps).arg(&add).arg(&po).arg(&n32).arg(&k32).arg(&ns);
        // SAFETY: the arguments match TMA_NORM_ENTRY in kernels/gemv_tma_sm90.cu; shapes as
        // documented (checked by the caller); k a multiple of 1,024 of at most 4,096 (the
        // norm weights a thread holds) and the shared memory within the attribute set at load.
        unsafe { b.launch(self.tma_config(k, *slots)) }
            .map_err(|e| kernel_err("gemv_tma_norm", e))?;
        Ok(true)
    }

    /// Whether a streamed matmul of `n` outputs and `k` inputs fits: a multiple of 1,024 up
    /// to `MAX_K`, its rings and input row within the shared memory allowed, the skinny
    /// matmuls on.
    fn tma_fits(&self, n: usize, k: usize, slots: usize) -> bool {
        let smem = 8 * slots * PIECE * 2 + k * 2;
        let shape = n > 0 && k > 0 && k <= MAX_K && k.is_multiple_of(PIECE);
        shape && smem <= TMA_GEMV_MAX_SMEM && self.gemv.is_some()
    }

    /// One block per SM of 288 threads; the rings (8 warps) and the input row.
    fn tma_config(&self, k: usize, slots: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.sms as u32, 1, 1),
            block_dim: (288, 1, 1),
            shared_mem_bytes: (8 * slots * PIECE * 2 + k * 2) as u32,
        }
    }
}
