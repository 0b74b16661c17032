//! The o fold (`LaunchOptions::fused_o`): 1-row decode steps whose context fits one
//! cluster run the o projection inside the fused attention (`kernels/fused_o.cuh`), which
//! writes one f32 partial of o's output per KV head; the gate|up matmul's add + RMSNorm
//! (`spdnorm_*` of `kernels/gemv.cu`, [`CudaKernels::norm_linear_into`] given the partials as
//! its delta) adds them in head order. One launch fewer a layer.

use candle_core::cuda_backend::cudarc::driver::CudaFunction;
use candle_core::{DType, Tensor};

use super::attention_handles::{FusedDecode, O_SMEM_MAX};
use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::error::Result;

/// The KV heads (the fused attention's grid heads) whose partials the o fold's norm adds: the
/// kernel's `NP` (every dense Qwen3 shape has 8 KV heads).
pub const O_FOLD_PARTS: usize = 8;

/// What a launch of the o fold takes: its kernels and dynamic shared memory, its partitions
/// (one cluster) and the kernel's `(o_w, o_part, hidden)`.
type FoldLaunch<'a> = ((&'a [CudaFunction; 4], u32), usize, (u64, u64, i32));

impl CudaKernels {
    /// Whether the o fold's kernels are loaded for steps of `rows` rows (a forward of such
    /// steps keeps a partials buffer).
    pub fn o_fold_loaded(&self, rows: usize) -> bool {
        self.decode_fused
            .as_ref()
            .is_some_and(|f| f.chosen_o(rows).is_some())
    }

    /// Whether a decode step of `rows` rows whose contexts fit one cluster may fold o (weight
    /// `o_w` `[hidden, nh * hd]`) into the fused attention over `nkv` KV heads, with the next
    /// gate|up (`gate_up` `[2I, hidden]`) adding the partials: the kernels are loaded
    /// (`LaunchOptions::fused_o`) for the step's rows, the grid has [`O_FOLD_PARTS`] KV heads,
    /// a block's share of o fits its shared memory, and the gate|up kernel serves the rows.
    pub fn o_fold_serves(
        &self,
        rows: usize,
        (nh, nkv, hd): (usize, usize, usize),
        o_w: &Tensor,
        gate_up: &Tensor,
    ) -> bool {
        let Some(fused) = &self.decode_fused else {
            return false;
        };
        let (Ok((hidden, cols)), Ok(gu)) = (o_w.dims2(), gate_up.dims2()) else {
            return false;
        };
        self.fused_decode_supports(rows, nh, nkv, hd)
            && fused.chosen_o(rows).is_some()
            && o_w.dtype() == DType::BF16
            && cols == nh * hd
            && gu.1 == hidden
            && self.o_share(rows, (nh, nkv, hd), hidden).is_some()
            && self.parts_gemv(rows, gu).is_some()
    }

    /// The o fold's cluster for `rows` rows and the bytes of o a block stages, where the
    /// shape folds (see [`CudaKernels::o_fold_serves`]).
    fn o_share(
        &self,
        rows: usize,
        (nh, nkv, hd): (usize, usize, usize),
        hidden: usize,
    ) -> Option<(usize, usize)> {
        let (g, shift) = self.fused_group(nh / nkv.max(1));
        let c = self.decode_cluster(rows, nh / nkv.max(1), self.cluster_splits(rows, 1));
        let share = (hidden / c.max(1)) * g * hd * 2;
        (c > 1 && nkv << shift == O_FOLD_PARTS && hidden.is_multiple_of(c) && share <= O_SMEM_MAX)
            .then_some((c, share))
    }

    /// The launch of the fused attention with the o fold for `b` rows of `nh` query heads over
    /// `nkv` KV heads of 128 dims (`short`: every context fits one cluster), o's weight and
    /// the partials `[b, O_FOLD_PARTS, hidden]` f32 in `(o_w, o_part)`.
    pub(super) fn o_fold_launch<'a>(
        &self,
        fused: &'a FusedDecode,
        (b, nh, nkv): (usize, usize, usize),
        short: bool,
        (o_w, o_part): (&Tensor, &Tensor),
    ) -> Result<FoldLaunch<'a>> {
        let err = |m: &str| kernel_err("decode_fused (o fold)", m);
        let Some((fs, smem)) = fused.chosen_o(b).filter(|_| short) else {
            return Err(err("not loaded for this step (fused_o, rows, one cluster)"));
        };
        let (hidden, cols) = o_w.dims2()?;
        if o_w.dtype() != DType::BF16 || cols != nh * 128 {
            return Err(err("o's weight is not bf16 [hidden, heads * 128]"));
        }
        let Some((c, share)) = self.o_share(b, (nh, nkv, 128), hidden) else {
            return Err(err(
                "the shape does not fold (KV heads, cluster, shared memory)",
            ));
        };
        if o_part.dtype() != DType::F32 || o_part.elem_count() != b * O_FOLD_PARTS * hidden {
            return Err(err("the partials are not f32 [rows, 8, hidden]"));
        }
        let o = (self.ptr(o_w)?, self.ptr(o_part)?, hidden as i32);
        let staged = if fused.o_staged { share as u32 } else { 0 };
        Ok(((fs, smem + staged), c, o))
    }

    /// [`CudaKernels::decode_fused_into`] with o folded in (`LaunchOptions::fused_o`; every
    /// context within one cluster): besides the attention's output in `out`, each KV head's
    /// share of `out · o_wᵀ` (f32, `[B, O_FOLD_PARTS, hidden]`) into `o_part`, which
    /// [`CudaKernels::norm_linear_into`] takes as the delta of a gate|up matmul. Errors where
    /// [`CudaKernels::o_fold_serves`] would say no.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_fused_o_into(
        &self,
        qkv: &Tensor,
        norms: (&Tensor, &Tensor, f64),
        inv_freq: &Tensor,
        pos_slots: (&Tensor, &Tensor),
        kv: crate::engine::kv_format::KvRef<'_>,
        tables: (&Tensor, Option<&Tensor>),
        ctx_lens: &Tensor,
        block_size: usize,
        out: &Tensor,
        parts: (usize, usize, Option<&(Tensor, Tensor)>, &Tensor),
        fold: (&Tensor, &Tensor),
    ) -> Result<()> {
        self.decode_fused_launch(
            qkv,
            norms,
            inv_freq,
            pos_slots,
            kv,
            tables,
            ctx_lens,
            block_size,
            out,
            parts,
            (true, 0, Some(fold)),
        )
    }
}
