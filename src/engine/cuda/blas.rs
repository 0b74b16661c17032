//! [`Blas`]: a cuBLAS handle on the kernels' stream with a workspace of its own, so matmuls
//! write into the engine's buffers and allocate nothing (graph capture).

use std::ffi::c_void;

use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, sys};
use candle_core::cuda_backend::cudarc::driver::CudaSlice;

use super::launch::kernel_err;
use crate::error::Result;

/// Bytes of the cuBLAS workspace (the size NVIDIA recommends for Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle on the kernels' stream and its workspace.
pub(crate) struct Blas {
    pub(crate) handle: CudaBlas,
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
