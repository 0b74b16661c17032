//! The forward's matmuls, written into buffers the caller owns (candle's matmul allocates its
//! output, which a captured graph must not do): the skinny-matmul kernels of
//! `kernels/gemv.cu` for decode steps of up to 8 rows (bf16), cuBLAS otherwise.
//!
//! Invariant: the handle runs on the kernels' stream with a workspace of its own, allocated
//! once, so a matmul inside graph capture allocates nothing.

use std::ffi::c_void;

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, result as blas, sys};
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, LaunchConfig, PushKernelArg,
};
use candle_core::{DType, Tensor};

use super::{CudaKernels, kernel_err};
use crate::error::Result;

/// Warps per block and output rows per warp of `kernels/gemv.cu` (`WARPS`, `R`).
const GEMV_WARPS: usize = 8;
const GEMV_ROWS: usize = 4;

/// Bytes of the cuBLAS workspace (the size NVIDIA recommends for Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle on the kernels' stream and its workspace.
pub(crate) struct Blas {
    handle: CudaBlas,
    _workspace: CudaSlice<u8>,
}

impl Blas {
    pub(crate) fn new(
        stream: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    ) -> Result<Self> {
        let handle = CudaBlas::new(stream.clone()).map_err(|e| kernel_err("cuBLAS", e))?;
        // SAFETY: the workspace is only used by cuBLAS, which writes before it reads.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .map_err(|e| kernel_err("cuBLAS workspace", e))?;
        use candle_core::cuda_backend::cudarc::driver::DevicePtr;
        let (ptr, _guard) = workspace.device_ptr(stream);
        // SAFETY: the workspace outlives the handle (both live in this struct, the handle is
        // dropped first as it is declared first).
        unsafe {
            sys::cublasSetWorkspace_v2(*handle.handle(), ptr as *mut c_void, WORKSPACE_BYTES)
                .result()
        }
        .map_err(|e| kernel_err("cuBLAS workspace", e))?;
        drop(_guard);
        Ok(Self {
            handle,
            _workspace: workspace,
        })
    }
}

impl CudaKernels {
    /// `out = x · wᵀ` for x `[T, in]`, a weight `[out, in]` (a linear layer's layout) and
    /// out `[T, out]`, all contiguous and of the kernels' dtype (f32 accumulation).
    pub fn linear_into(&self, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
        self.check_dtype(x)?;
        self.check_dtype(w)?;
        self.check_dtype(out)?;
        let (n_out, k) = w.dims2()?;
        let t = x.elem_count() / k.max(1);
        if x.dim(candle_core::D::Minus1)? != k || out.elem_count() != t * n_out {
            return Err(kernel_err(
                "linear",
                format!(
                    "x {:?} · w {:?}ᵀ does not fit out {:?}",
                    x.shape(),
                    w.shape(),
                    out.shape()
                ),
            ));
        }
        if t == 0 {
            return Ok(());
        }
        let (px, pw, po) = (self.ptr(x)?, self.ptr(w)?, self.ptr(out)?);
        if let Some(f) = self.gemv_for(0, t, k) {
            return self.launch_gemv(f, (pw, px, po), n_out, k, n_out.div_ceil(GEMV_ROWS));
        }
        let ty = match self.dtype {
            DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
            DType::F32 => sys::cudaDataType::CUDA_R_32F,
            other => return Err(kernel_err("linear", format!("dtype {other:?}"))),
        };
        let (alpha, beta) = (1f32, 0f32);
        let (m, n, kk) = (n_out as i32, t as i32, k as i32);
        // Column-major view: outᵀ [out, T] = W [out, in] (the row-major weight read
        // transposed) · xᵀ [in, T].
        // SAFETY: the pointers are live device buffers of the sizes checked above, on the
        // handle's stream; alpha/beta are host f32 as CUBLAS_COMPUTE_32F wants.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle.handle(),
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                m,
                n,
                kk,
                (&alpha as *const f32).cast(),
                pw as *const c_void,
                ty,
                kk,
                px as *const c_void,
                ty,
                kk,
                (&beta as *const f32).cast(),
                po as *mut c_void,
                ty,
                m,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| kernel_err("linear (cuBLAS)", e))?;
        Ok(())
    }

    /// `act = silu(x · gateᵀ) * (x · upᵀ)` for a gate|up weight `[2I, in]` (gate rows first)
    /// and act `[T, I]`: one fused skinny-matmul launch for T <= 8 rows, else a cuBLAS matmul
    /// into `gu` (`[T, 2I]`) and the SiLU*up kernel.
    pub fn gate_up_silu_into(
        &self,
        x: &Tensor,
        w: &Tensor,
        gu: &Tensor,
        act: &Tensor,
    ) -> Result<()> {
        let (two_i, k) = w.dims2()?;
        let t = x.elem_count() / k.max(1);
        let inter = two_i / 2;
        if let Some(f) = self.gemv_for(1, t, k) {
            self.check_dtype(x)?;
            self.check_dtype(w)?;
            self.check_dtype(act)?;
            if x.dim(candle_core::D::Minus1)? != k || act.elem_count() != t * inter {
                return Err(kernel_err("gate_up_silu", "shapes do not fit"));
            }
            let ptrs = (self.ptr(w)?, self.ptr(x)?, self.ptr(act)?);
            return self.launch_gemv(f, ptrs, inter, k, inter.div_ceil(GEMV_ROWS / 2));
        }
        self.linear_into(x, w, gu)?;
        self.silu_mul_into(gu, act)
    }

    /// The skinny-matmul kernel (`kind` 0: plain, 1: fused SiLU*up) for `t` rows over `k`
    /// inputs, when one serves them.
    fn gemv_for(&self, kind: usize, t: usize, k: usize) -> Option<&CudaFunction> {
        let fs = self.gemv.as_ref()?;
        if t == 0 || t > super::GEMV_MAX_ROWS || k % 8 != 0 {
            return None;
        }
        Some(&fs[kind][t - 1])
    }

    fn launch_gemv(
        &self,
        f: &CudaFunction,
        (pw, px, po): (u64, u64, u64),
        n: usize,
        k: usize,
        warps: usize,
    ) -> Result<()> {
        let (n32, k32) = (n as i32, k as i32);
        let cfg = LaunchConfig {
            grid_dim: (warps.div_ceil(GEMV_WARPS) as u32, 1, 1),
            block_dim: (32 * GEMV_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&pw).arg(&px).arg(&po).arg(&n32).arg(&k32);
        // SAFETY: argument types match `kernels/gemv.cu`; the callers checked the shapes, k is
        // a multiple of 8 and the buffers are contiguous.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// [`CudaKernels::linear_into`] into a new `[T, out]` buffer.
    pub fn linear(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let t = x.elem_count() / x.dim(candle_core::D::Minus1)?.max(1);
        let out = self.alloc_out((t, w.dim(0)?))?;
        self.linear_into(x, w, &out)?;
        Ok(out)
    }
}
