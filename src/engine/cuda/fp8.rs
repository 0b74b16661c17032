//! The kernels over fp8 (e4m3) KV caches: their handles ([`Fp8Kernels`], loaded with the
//! others by `CudaKernels::new` where the GPU has fp8) and how a launch finds them.

use super::attention_handles::Fp8Kernels;
use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::error::Result;

impl CudaKernels {
    /// Whether these kernels serve fp8 KV caches (`Err`: why not, for the start-up error).
    pub fn fp8_kv(&self) -> std::result::Result<(), String> {
        self.fp8.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    /// The fp8 kernels, for a launch over an fp8 cache.
    pub(super) fn fp8_kernels(&self, what: &str) -> Result<&Fp8Kernels> {
        self.fp8.as_ref().map_err(|why| kernel_err(what, why))
    }
}
