//! The 1-row plain skinny matmul with its weights streamed into shared memory by the copy
//! engine (`kernels/gemv_tma_sm90.cu`, `LaunchOptions::gemv_tma`, sm_90): one block per SM of
//! 8 compute warps and a copy warp whose lanes keep each compute warp's ring of 2 KB weight
//! pieces full, from before the wait on the kernel before. The same sums in the same order as
//! the skinny matmuls of `kernels/gemv.cu` (the same bits).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;

use super::handles::TMA_GEMV_MAX_SMEM;
use super::kernels::CudaKernels;
use super::launch::kernel_err;
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
        // The rings (8 warps) and the input row.
        let smem = 8 * g.slots * PIECE * 2 + k * 2;
        let rows = g.any_rows || n == ROWS;
        let serves = t == 1 && k >= g.min_k && k <= MAX_K && k.is_multiple_of(PIECE) && rows;
        if !serves || smem > TMA_GEMV_MAX_SMEM || n == 0 || self.gemv.is_none() {
            return Ok(false);
        }
        let (n32, k32, ns) = (n as i32, k as i32, g.slots as i32);
        let mut b = self.launcher(&g.f);
        b.arg(&pw).arg(&px).arg(&po).arg(&n32).arg(&k32).arg(&ns);
        // SAFETY: the arguments match `gemv_tma` in kernels/gemv_tma_sm90.cu; the caller
        // checked the shapes (w `[n, k]`, x `[1, k]`, out `[1, n]`, contiguous bf16); k is a
        // multiple of 1,024 and the shared memory within the attribute set at load.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (self.sms as u32, 1, 1),
                block_dim: (288, 1, 1),
                shared_mem_bytes: smem as u32,
            })
        }
        .map_err(|e| kernel_err("gemv_tma", e))?;
        Ok(true)
    }
}
