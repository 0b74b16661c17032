//! The presummed norm of decode steps of 3-8 rows (`LaunchOptions::norm_presum`,
//! `kernels/gemv_mma.cu` `mma_gemv_res_*` and `mma_gemv_pre_*`). A step runs the add+RMSNorm
//! before qkv and gate|up as its own launch (the tensor-core skinny matmuls take their input
//! as it is); here the matmul before the norm (o, down) adds its output to the residual and
//! writes the sum's sums of squares per 16 columns, and the matmul after it normalizes its
//! input rows from those sums as it loads them: two launches a layer fewer.
//!
//! Invariant: a [`CudaKernels::linear_res_into`] is followed on the stream by the
//! [`CudaKernels::presum_linear_into`] that reads its sum and sums (nothing between them
//! writes either); the partial sums hold `ceil(n / 16) * 8` f32 ([`presum_len`]).

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, LaunchConfig};
use candle_core::{DType, Tensor};

use super::gemm::GEMV_MMA_ROWS;
use super::handles::GEMV_WARPS;
use super::kernels::{CudaKernels, GEMV_MAX_ROWS};
use super::launch::kernel_err;
use crate::error::Result;

/// Most partial sums a row's norm reads (`PS_PARTS` of `kernels/gemv_mma.cu`): a residual
/// of up to 4,096 columns.
const MAX_PARTS: usize = 256;

/// The f32 elements of the partial sums of squares for a residual of `hidden` columns.
pub fn presum_len(hidden: usize) -> usize {
    hidden.div_ceil(GEMV_MMA_ROWS) * 8
}

impl CudaKernels {
    /// Whether a step of `t` rows runs `producer` (`[hidden, k]`, the matmul before a norm)
    /// and `consumer` (`[n, hidden]`, the one after it) with the presummed norm: its kernels
    /// are loaded and the skinny-matmul dispatch (`gemv_for`) takes both weights at `t` rows
    /// on the tensor-core kernels (3-8 rows, weights within `gemv_mma_plain`'s bound).
    pub fn presum_serves(&self, t: usize, producer: &Tensor, consumer: &Tensor) -> bool {
        let (Ok((np, kp)), Ok((nc, kc))) = (producer.dims2(), consumer.dims2()) else {
            return false;
        };
        self.gemv_presum.is_some()
            && kc == np
            && np.div_ceil(GEMV_MMA_ROWS) <= MAX_PARTS
            && self.mma_gemv_serves(t, (np, kp))
            && self.mma_gemv_serves(t, (nc, kc))
    }

    /// `presum[rows - 3]` of kind `kind` (0: add to the residual, 1: plain behind the norm,
    /// 2: SiLU*up behind it).
    fn presum_kernel(&self, kind: usize, t: usize) -> Result<&CudaFunction> {
        self.gemv_presum
            .as_ref()
            .and_then(|k| k[kind].get(t.wrapping_sub(GEMV_MAX_ROWS + 1)))
            .ok_or_else(|| kernel_err("presummed norm", format!("no kernel for {t} rows")))
    }

    /// `out = x · wᵀ` for `t` rows (3-8), then `res_out = bf16(res + out)` and, per 16
    /// columns and row, the sum's squares summed into `ss` (f32 `[presum_len(n)]`).
    pub fn linear_res_into(
        &self,
        x: &Tensor,
        w: &Tensor,
        out: &Tensor,
        (res, res_out): (&Tensor, &Tensor),
        ss: &Tensor,
    ) -> Result<()> {
        let (n, k) = w.dims2()?;
        let t = x.elem_count() / k.max(1);
        for a in [x, w, out, res, res_out] {
            self.check_dtype(a)?;
        }
        let fits = x.dim(candle_core::D::Minus1)? == k
            && [out, res, res_out].iter().all(|a| a.elem_count() == t * n)
            && ss.dtype() == DType::F32
            && ss.elem_count() >= presum_len(n);
        if !fits {
            return Err(kernel_err("linear_res", "shapes do not fit"));
        }
        let f = self.presum_kernel(0, t)?;
        let (pw, px, po) = (self.ptr(w)?, self.ptr(x)?, self.ptr(out)?);
        let (pr, pro, pss) = (self.ptr(res)?, self.ptr(res_out)?, self.ptr(ss)?);
        let (n32, k32) = (n as i32, k as i32);
        let mut b = self.launcher(f);
        b.arg(&pw).arg(&px).arg(&po).arg(&n32).arg(&k32);
        b.arg(&pr).arg(&pro).arg(&pss);
        // SAFETY: argument types match `mma_gemv_res_t*_bf16`; shapes are checked above.
        unsafe { b.launch(Self::presum_grid(n)) }.w()?;
        Ok(())
    }

    /// `out = rmsnorm(h) · wᵀ` (or with `act`, `act = silu(gate) * up` of a gate|up `w`) for
    /// `t` rows (3-8) of the sum a [`Self::linear_res_into`] wrote to `h`: the input rounded
    /// as bf16(h * norm_w), the dot products scaled by 1 / rms from the partial sums `ss` it
    /// wrote (the deferred norm's rounding).
    pub fn presum_linear_into(
        &self,
        h: &Tensor,
        (norm_w, eps): (&Tensor, f64),
        ss: &Tensor,
        w: &Tensor,
        out: &Tensor,
        act: Option<&Tensor>,
    ) -> Result<()> {
        let (n_w, k) = w.dims2()?;
        let t = h.elem_count() / k.max(1);
        for a in [h, norm_w, w, out] {
            self.check_dtype(a)?;
        }
        let (dst, n) = match act {
            Some(a) => (a, n_w / 2),
            None => (out, n_w),
        };
        let fits = h.dim(candle_core::D::Minus1)? == k
            && norm_w.elem_count() == k
            && dst.elem_count() == t * n
            && ss.dtype() == DType::F32
            && ss.elem_count() >= presum_len(k);
        if !fits {
            return Err(kernel_err("presum_linear", "shapes do not fit"));
        }
        let f = self.presum_kernel(if act.is_some() { 2 } else { 1 }, t)?;
        let (pw, ph, po) = (self.ptr(w)?, self.ptr(h)?, self.ptr(dst)?);
        let (pnw, pss) = (self.ptr(norm_w)?, self.ptr(ss)?);
        let (n32, k32, eps32) = (n as i32, k as i32, eps as f32);
        let parts = k.div_ceil(GEMV_MMA_ROWS) as i32;
        let mut b = self.launcher(f);
        b.arg(&pw).arg(&ph).arg(&po).arg(&n32).arg(&k32);
        b.arg(&pnw).arg(&eps32).arg(&pss).arg(&parts);
        // SAFETY: argument types match `mma_gemv_pre{,_silu}_t*_bf16`; shapes are checked
        // above.
        unsafe { b.launch(Self::presum_grid(n)) }.w()?;
        Ok(())
    }

    /// A block of 8 warps per 16 output rows (gate/up pairs for SiLU), as the tensor-core
    /// skinny matmuls launch.
    fn presum_grid(n: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (n.div_ceil(GEMV_MMA_ROWS) as u32, 1, 1),
            block_dim: (32 * GEMV_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}
