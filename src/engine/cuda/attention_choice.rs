//! Which decode attention a step takes (`attention.rs` launches them): the fused launch at
//! up to `LaunchOptions::fused_max_rows` rows of a shape it serves, its tensor-core loop for
//! contexts one cluster holds, and the unfused kernels past `LaunchOptions::fused_long_ctx`.
//! Eager steps and the CUDA graphs (`crate::engine::runner::graphs`) ask the same questions.

use super::attention::{FUSED_MAX_ROWS, GQA8_SPLIT_MAX_ROWS};
use super::kernels::CudaKernels;

impl CudaKernels {
    /// Whether the forward runs a decode step of `rows` sequences through
    /// [`CudaKernels::decode_fused_into`] on a layer of `nh` query heads over `nkv` KV heads of
    /// `hd` dims: at most [`FUSED_MAX_ROWS`] rows (and `LaunchOptions::fused_max_rows`) of a
    /// shape the kernel serves.
    /// GQA group 8 (the 30B-A3B's 32 query / 4 KV heads) is fused only as two group-4 halves
    /// ([`CudaKernels::fused_group`]): as group 8 no cluster merges it, and its merge through
    /// global memory made the fused kernel 22.8 us at batch 1 and 35.3 at 8 against 2.9 + 8.5
    /// and 3.0 + 8.8 unfused (`graph_check --profile`, H200).
    pub fn fused_decode_supports(&self, rows: usize, nh: usize, nkv: usize, hd: usize) -> bool {
        let g = nh / nkv.max(1);
        rows <= FUSED_MAX_ROWS.min(self.fused_max_rows)
            && self.fused_decode_serves(nh, nkv, hd)
            && matches!(self.fused_group(g).0, 1 | 2 | 4)
            && (g != 8 || rows <= GQA8_SPLIT_MAX_ROWS)
    }

    /// Whether a decode step of `rows` rows of GQA group `g` in `splits` partitions whose
    /// longest context is `max_ctx` tokens may run the fused attention's tensor-core kernels
    /// (`LaunchOptions::fused_mma`): they are loaded, the step has at most `fused_mma_rows`
    /// rows, and every context fits one cluster (`CLUSTER_PART` = 128 tokens a block), where
    /// they attend on tensor cores (past it they fall back to the CUDA-core loop at lower
    /// occupancy: on the H200 0.6B batch 1 after 8k tokens 566 against 731 tok/s).
    pub fn fused_short_context(
        &self,
        rows: usize,
        g: usize,
        splits: usize,
        max_ctx: usize,
    ) -> bool {
        self.decode_fused
            .as_ref()
            .is_some_and(|f| f.mma.is_some() && rows <= f.mma_rows)
            && {
                let c = self.decode_cluster(rows, g, splits);
                c > 1 && max_ctx <= c * 128
            }
    }

    /// Whether a decode step of `rows` rows whose longest context is `max_ctx` tokens runs its
    /// attention unfused (`LaunchOptions::fused_long_ctx`; `fused_long_ctx_one` for one row,
    /// `fused_long_ctx_many` for 5+ rows, where set).
    pub fn fused_long_context(&self, rows: usize, max_ctx: usize) -> bool {
        let bound = match rows {
            1 => self.fused_long_ctx_one,
            2..=4 => self.fused_long_ctx,
            _ => self.fused_long_ctx_many.or(self.fused_long_ctx),
        };
        bound.is_some_and(|n| max_ctx > n)
    }

    /// Whether [`CudaKernels::decode_fused_into`] serves the shape (bf16, head_dim 128, GQA
    /// group 1, 2, 4 or 8; only with `LaunchOptions::fused_decode`), at any batch.
    pub(super) fn fused_decode_serves(&self, nh: usize, nkv: usize, hd: usize) -> bool {
        self.decode_fused.is_some()
            && hd == 128
            && nkv > 0
            && nh.is_multiple_of(nkv)
            && matches!(nh / nkv, 1 | 2 | 4 | 8)
    }
}
