//! The fused MLP of 1-2-row decode steps (`LaunchOptions::mlp_fused`, `kernels/mlp_fused.cu`):
//! the add+RMSNorm, gate|up with SiLU*up and down in one launch of [`MLP_BLOCKS`] blocks in
//! thread-block clusters, down split over the intermediate channels. Its output is not down's
//! bf16 row but one f32 partial sum per cluster ([`mlp_parts_len`]), which the next layer's
//! norm + qkv adds up (`kernels/gemv.cu` `pnorm_gemv_*`, through
//! [`CudaKernels::norm_linear_into`] given the partials as its delta): one launch and one
//! whole-grid dependency a layer fewer.
//!
//! Invariant: an [`CudaKernels::mlp_fused_into`] is followed on the stream by the norm + matmul
//! that reads its partials (nothing between them writes them), and a step takes the fused MLP
//! only where [`CudaKernels::mlp_fused_serves`] says that norm + matmul takes them.

use std::sync::Arc;

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};
use candle_core::{DType, Tensor};

use super::gemm::GEMV_WARPS;
use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::error::Result;

/// Blocks of a fused-MLP launch (`MLP_BLOCKS` of `kernels/mlp_fused.cu`).
const MLP_BLOCKS: usize = 128;
/// Blocks of one of its thread-block clusters (`CL`).
const MLP_CLUSTER: usize = 16;
/// The partial sums of down a row of its output holds: one per cluster.
pub const MLP_PARTS: usize = MLP_BLOCKS / MLP_CLUSTER;
/// The hidden size the kernels are built for (256 x P, P = 4: Qwen3-0.6B's).
const MLP_HIDDEN: usize = 1024;
/// Intermediate channels of one block (8 warps x CPW = 3): an intermediate size of
/// [`MLP_BLOCKS`] x 24 = 3,072 (Qwen3-0.6B's).
const MLP_CHANNELS: usize = 24;
/// Most token rows a fused MLP takes.
const MLP_MAX_ROWS: usize = 2;

/// The f32 elements of the fused MLP's partial sums for `t` rows of `hidden`:
/// `[t, MLP_PARTS, hidden]`.
pub fn mlp_parts_len(t: usize, hidden: usize) -> usize {
    t * MLP_PARTS * hidden
}

/// Dynamic shared memory of a block for `t` rows (`mlp_smem_bytes` of the kernel): down's
/// columns, the normed rows, the SiLU products and the down partial.
fn mlp_smem(t: usize) -> usize {
    MLP_HIDDEN * MLP_CHANNELS * 2 + t * MLP_HIDDEN * 2 + t * MLP_CHANNELS * 4 + t * MLP_HIDDEN * 4
}

/// The fused MLP's kernels.
pub(super) struct MlpFused {
    /// `mlp_fused_t{1,2}_*`.
    mlp: [CudaFunction; MLP_MAX_ROWS],
    /// `pnorm_gemv_t{1,2}_bf16`: the deferred norm + matmul on the partials.
    pnorm: [CudaFunction; MLP_MAX_ROWS],
}

impl MlpFused {
    /// The kernels from their modules (sm_90).
    pub(super) fn load(mlp: &Arc<CudaModule>, gemv: &Arc<CudaModule>) -> Result<Self> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute as A;
        let f = |m: &Arc<CudaModule>, name: String| {
            m.load_function(&name)
                .map_err(|e| kernel_err(&format!("function {name}"), e))
        };
        let mlp_t = |t: usize| -> Result<CudaFunction> {
            let func = f(mlp, format!("mlp_fused_t{t}_c3_p4"))?;
            func.set_attribute(A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
                .map_err(|e| kernel_err("mlp_fused cluster size", e))?;
            func.set_attribute(
                A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                mlp_smem(t) as i32,
            )
            .map_err(|e| kernel_err("mlp_fused shared memory", e))?;
            Ok(func)
        };
        Ok(Self {
            mlp: [mlp_t(1)?, mlp_t(2)?],
            pnorm: [
                f(gemv, "pnorm_gemv_t1_bf16".into())?,
                f(gemv, "pnorm_gemv_t2_bf16".into())?,
            ],
        })
    }
}

impl CudaKernels {
    /// Whether a step of `t` rows runs its MLP over `gate_up` (`[2I, H]`) and `down`
    /// (`[H, I]`) as one fused launch whose partials the next norm + matmul over `next`
    /// (`[N, H]`) takes: the kernels are loaded, 1-2 rows, and the shapes are the ones they
    /// are built for (H 1,024, I 3,072).
    pub fn mlp_fused_serves(
        &self,
        t: usize,
        gate_up: &Tensor,
        down: &Tensor,
        next: &Tensor,
    ) -> bool {
        let (Ok(gu), Ok(d), Ok((_, nk))) = (gate_up.dims2(), down.dims2(), next.dims2()) else {
            return false;
        };
        let inter = MLP_BLOCKS * MLP_CHANNELS;
        self.mlp_fused.is_some()
            && (1..=MLP_MAX_ROWS).contains(&t)
            && gu == (2 * inter, MLP_HIDDEN)
            && d == (MLP_HIDDEN, inter)
            && nk == MLP_HIDDEN
    }

    /// The buffer the fused MLP writes its partials to for up to `t` rows of `hidden`, when it
    /// is loaded (f32 `[min(t, 2), MLP_PARTS, hidden]`).
    pub fn mlp_parts(&self, t: usize, hidden: usize) -> Result<Option<Tensor>> {
        if self.mlp_fused.is_none() {
            return Ok(None);
        }
        let shape = (t.min(MLP_MAX_ROWS), MLP_PARTS, hidden);
        Ok(Some(self.alloc(shape, DType::F32)?))
    }

    /// The MLP of `t` rows (1-2) in one launch: `res_out = bf16(res + delta)`, then down's
    /// output over `silu(h gateᵀ) * (h upᵀ)` for `h = rmsnorm(res_out) * norm_w`, as
    /// per-cluster f32 partial sums into `parts` (from [`Self::mlp_parts`]), for the next
    /// [`Self::norm_linear_into`] to take as its delta. Only where [`Self::mlp_fused_serves`].
    pub fn mlp_fused_into(
        &self,
        (res, delta, res_out): (&Tensor, &Tensor, &Tensor),
        (norm_w, eps): (&Tensor, f64),
        gate_up: &Tensor,
        down: &Tensor,
        parts: &Tensor,
    ) -> Result<()> {
        let m = self
            .mlp_fused
            .as_ref()
            .ok_or_else(|| kernel_err("mlp_fused", "not loaded (KernelOptions::mlp_fused)"))?;
        let t = res.elem_count() / MLP_HIDDEN;
        let fits = (1..=MLP_MAX_ROWS).contains(&t)
            && res.elem_count() == t * MLP_HIDDEN
            && delta.elem_count() == res.elem_count()
            && res_out.elem_count() == res.elem_count()
            && norm_w.elem_count() == MLP_HIDDEN
            && parts.dtype() == DType::F32
            && parts.elem_count() == mlp_parts_len(t, MLP_HIDDEN);
        if !fits {
            return Err(kernel_err("mlp_fused", "shapes do not fit"));
        }
        for x in [res, delta, res_out, norm_w, gate_up, down] {
            self.check_dtype(x)?;
        }
        let (pgu, pd, pr, pdl, pro, pnw, pp) = (
            self.ptr(gate_up)?,
            self.ptr(down)?,
            self.ptr(res)?,
            self.ptr(delta)?,
            self.ptr(res_out)?,
            self.ptr(norm_w)?,
            self.ptr(parts)?,
        );
        let (eps32, i32_) = (eps as f32, (MLP_BLOCKS * MLP_CHANNELS) as i32);
        let cfg = LaunchConfig {
            grid_dim: (MLP_BLOCKS as u32, 1, 1),
            block_dim: (32 * GEMV_WARPS as u32, 1, 1),
            shared_mem_bytes: mlp_smem(t) as u32,
        };
        let mut b = self.launcher(&m.mlp[t - 1]);
        b.cluster_x(MLP_CLUSTER as u32);
        b.arg(&pgu).arg(&pd).arg(&pr).arg(&pdl).arg(&pro).arg(&pnw);
        b.arg(&eps32).arg(&pp).arg(&i32_);
        // SAFETY: argument types match MLP_ENTRY of `kernels/mlp_fused.cu`; the shapes are
        // checked above (and by `mlp_fused_serves` for the weights); res and res_out are
        // different buffers (the caller's ping-pong residual).
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// [`Self::norm_linear_into`] on a delta of the fused MLP's partials (f32
    /// `[t, parts, k]`): the deferred norm kernel that sums them (`pnorm_gemv_*`).
    pub(super) fn parts_norm_linear_into(
        &self,
        (res, parts, res_out): (&Tensor, &Tensor, &Tensor),
        (norm_w, eps): (&Tensor, f64),
        w: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let m = self
            .mlp_fused
            .as_ref()
            .ok_or_else(|| kernel_err("norm_linear", "an f32 delta without the fused MLP"))?;
        let (n, k) = w.dims2()?;
        let t = res.elem_count() / k.max(1);
        let fits = (1..=MLP_MAX_ROWS).contains(&t)
            && res.elem_count() == t * k
            && k == MLP_HIDDEN
            && parts.elem_count() == mlp_parts_len(t, k)
            && res_out.elem_count() == res.elem_count()
            && out.elem_count() == t * n;
        if !fits {
            return Err(kernel_err("norm_linear (partials)", "shapes do not fit"));
        }
        for x in [res, res_out, norm_w, w, out] {
            self.check_dtype(x)?;
        }
        let (pw, pr, pd, pro, pnw, po) = (
            self.ptr(w)?,
            self.ptr(res)?,
            self.ptr(parts)?,
            self.ptr(res_out)?,
            self.ptr(norm_w)?,
            self.ptr(out)?,
        );
        let (eps32, add, n32, k32) = (eps as f32, 1 + MLP_PARTS as i32, n as i32, k as i32);
        let (pf, pf_bytes) = (0u64, 0u64);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(GEMV_WARPS) as u32, 1, 1),
            block_dim: (32 * GEMV_WARPS as u32, 1, 1),
            // The normed rows, then one row's partials (`norm_rows_parts`'s stage).
            shared_mem_bytes: (t * k * 2 + MLP_PARTS * k * 4) as u32,
        };
        let mut b = self.launcher(&m.pnorm[t - 1]);
        b.arg(&pw)
            .arg(&pr)
            .arg(&pd)
            .arg(&pro)
            .arg(&pnw)
            .arg(&eps32)
            .arg(&add);
        b.arg(&po).arg(&n32).arg(&k32).arg(&pf).arg(&pf_bytes);
        // SAFETY: argument types match NORM_ENTRY of `kernels/gemv.cuh`; shapes checked above.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }
}
