//! The fused decode attention's partials merged inside o (`LaunchOptions::attn_merge_o`): a
//! 1-2-row step whose contexts fit one cluster runs the fused attention without clusters and
//! without a merge, every block writing its partial (`kernels/fused_decode.cu` with
//! `partials`), and o's matmul merges them as it reads its input (`kernels/decode.cu`
//! `merge_o`): the bits of the unfused kernels at that partitioning (the tensor-core paged
//! decode, its merge, the plain skinny matmul), in the two launches the default takes.

use candle_core::Tensor;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;

use super::gemm::GEMV_WARPS;
use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::engine::kv_format::KvRef;
use crate::error::Result;

/// Shortest partition of the merge in o (a tensor-core chunk): contexts of up to
/// 16 x S tokens take one partition per 16 tokens.
pub const MERGE_O_PART_MIN: usize = 16;

/// The partitions the kernels exist for that `s` asks for: 4, 8 or 16 (the smallest at
/// least `s`, at most 16).
pub(super) fn merge_o_partitions(s: usize) -> usize {
    match s {
        0..=4 => 4,
        5..=8 => 8,
        _ => 16,
    }
}

impl CudaKernels {
    /// The attention's partitions when a decode step of `rows` rows over `nh` heads of
    /// 128 dims, every context fitting one cluster (`short`), merges them inside o
    /// (`LaunchOptions::attn_merge_o`): None when it does not (not loaded, more than 2 rows,
    /// a long context, a shape the fused attention does not serve).
    pub fn merge_o_splits(
        &self,
        rows: usize,
        short: bool,
        (nh, nkv): (usize, usize),
    ) -> Option<usize> {
        let (s, _) = self.decode_fused.as_ref()?.merge_o.as_ref()?;
        (short && (1..=2).contains(&rows) && self.fused_decode_serves(nh, nkv, 128)).then_some(*s)
    }

    /// The fused decode attention of [`CudaKernels::decode_fused_into`] (same arguments, in
    /// [`CudaKernels::merge_o_splits`] partitions of at least [`MERGE_O_PART_MIN`] tokens)
    /// writing every partition's partial into `scratch` and nothing else: no merge, no
    /// clusters, no counters touched; `out` only gets the zeros of padding rows (context 0).
    /// [`CudaKernels::merge_o_into`] then merges them inside o.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_fused_partials_into(
        &self,
        qkv: &Tensor,
        norms: (&Tensor, &Tensor, f64),
        inv_freq: &Tensor,
        pos_slots: (&Tensor, &Tensor),
        kv: KvRef<'_>,
        tables: (&Tensor, Option<&Tensor>),
        ctx_lens: &Tensor,
        block_size: usize,
        out: &Tensor,
        (splits, scratch, counters): (usize, &(Tensor, Tensor), &Tensor),
    ) -> Result<()> {
        self.fused_launch(
            qkv,
            norms,
            inv_freq,
            pos_slots,
            kv,
            tables,
            ctx_lens,
            block_size,
            out,
            (splits, MERGE_O_PART_MIN, Some(scratch), counters),
            true,
            (0, true),
        )
    }

    /// `out = x · wᵀ` for the 1-2 rows of `ctx_lens`, x the attention output merged from the
    /// partials of [`CudaKernels::decode_fused_partials_into`] (`scratch`, in `splits`
    /// partitions: [`CudaKernels::merge_o_splits`]'s) in one launch: the bits of the unfused
    /// merge (`paged_decode_into`'s) followed by [`CudaKernels::linear_into`].
    pub fn merge_o_into(
        &self,
        (acc, ml): &(Tensor, Tensor),
        ctx_lens: &Tensor,
        splits: usize,
        w: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let rows = ctx_lens.elem_count();
        let (n, k) = w.dims2()?;
        let Some((s, fs)) = self.decode_fused.as_ref().and_then(|f| f.merge_o.as_ref()) else {
            return Err(kernel_err("merge_o", "not loaded (attn_merge_o is off)"));
        };
        let nh = k / 128;
        if *s != splits
            || !(1..=2).contains(&rows)
            || k % 128 != 0
            || out.elem_count() != rows * n
            || acc.elem_count() < rows * nh * s * 128
            || ml.elem_count() < rows * nh * s * 2
        {
            return Err(kernel_err(
                "merge_o",
                format!("rows {rows} w {n}x{k} splits {splits} (loaded {s})"),
            ));
        }
        self.check_dtype(w)?;
        self.check_dtype(out)?;
        let (n32, k32, pmin) = (n as i32, k as i32, MERGE_O_PART_MIN as i32);
        let (pw, pa, pm, pc, po) = (
            self.ptr(w)?,
            self.ptr(acc)?,
            self.ptr(ml)?,
            self.ptr(ctx_lens)?,
            self.ptr(out)?,
        );
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(GEMV_WARPS) as u32, 1, 1),
            block_dim: (32 * GEMV_WARPS as u32, 1, 1),
            shared_mem_bytes: (rows * k * 2) as u32,
        };
        let mut b = self.launcher(&fs[rows - 1]);
        b.arg(&pw)
            .arg(&pa)
            .arg(&pm)
            .arg(&pc)
            .arg(&po)
            .arg(&n32)
            .arg(&k32)
            .arg(&pmin);
        // SAFETY: the arguments match `merge_o_t{T}_s{S}` of `kernels/decode.cu`; the shapes
        // and partial buffers are checked above, k is a multiple of 128, the shared memory
        // (T x K bf16, at most 2 x 16 KiB for 64 heads) is under the 48 KiB default.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }
}
