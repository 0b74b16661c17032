//! The launch of a sparse layer's add+RMSNorm and router matmul in one kernel
//! (`kernels/moe_router.cu`, `LaunchOptions::moe_norm_router`), in front of `moe_ops.rs`'
//! experts; without it the forward runs the dense kernels' norm and matmul.

use candle_core::Tensor;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::error::Result;

impl CudaKernels {
    /// `h = rmsnorm(res + delta) * norm_w` (the sum written to `res_out` when `delta` is
    /// given) and `logits = h · routerᵀ` in one launch, for 1-2 rows of a hidden size of up
    /// to 4,096 and with `LaunchOptions::moe_norm_router`; false, with nothing launched,
    /// otherwise (the caller runs the norm and the matmul apart).
    pub fn moe_norm_router_into(
        &self,
        (res, delta, res_out): (&Tensor, Option<&Tensor>, &Tensor),
        (norm_w, eps): (&Tensor, f64),
        h: &Tensor,
        router: &Tensor,
        logits: &Tensor,
    ) -> Result<bool> {
        let Some(fs) = &self.moe.norm_router else {
            return Ok(false);
        };
        let (e, k) = router.dims2()?;
        let t = res.elem_count() / k.max(1);
        if !(1..=2).contains(&t) || k > 4096 || !k.is_multiple_of(8) {
            return Ok(false);
        }
        for x in [res, res_out, norm_w, h, router, logits] {
            self.check_dtype(x)?;
        }
        let fits = res.elem_count() == t * k
            && res_out.elem_count() == t * k
            && h.elem_count() == t * k
            && norm_w.elem_count() == k
            && logits.elem_count() == t * e
            && delta.is_none_or(|d| d.elem_count() == t * k);
        if !fits {
            return Err(kernel_err("moe_norm_router", "shapes do not fit"));
        }
        let (pw, pr, pro, pnw, ph, pl) = (
            self.ptr(router)?,
            self.ptr(res)?,
            self.ptr(res_out)?,
            self.ptr(norm_w)?,
            self.ptr(h)?,
            self.ptr(logits)?,
        );
        let (pd, add) = match delta {
            Some(d) => (self.ptr(d)?, 1i32),
            None => (pr, 0i32),
        };
        let (e32, k32, eps32) = (e as i32, k as i32, eps as f32);
        let cfg = LaunchConfig {
            grid_dim: (e.div_ceil(8) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: (t * k * 2) as u32,
        };
        let mut b = self.launcher(&fs[t - 1]);
        b.arg(&pw).arg(&pr).arg(&pd).arg(&pro).arg(&pnw).arg(&eps32);
        b.arg(&add).arg(&ph).arg(&pl).arg(&e32).arg(&k32);
        // SAFETY: argument types match `moe_norm_router_t*`; shapes checked above; t * k bf16
        // of dynamic shared memory (at most 16 KB).
        unsafe { b.launch(cfg) }.w()?;
        Ok(true)
    }
}
