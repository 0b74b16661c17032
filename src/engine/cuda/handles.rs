//! Handles that `CudaKernels` holds and the launch files use (kept apart so that those files
//! and `kernels.rs` do not import from each other).

use candle_core::cuda_backend::cudarc::driver::{CudaEvent, CudaFunction, PinnedHostSlice};

/// The kernels that read or write an fp8 (e4m3) KV cache, bf16 compute: the `_fp8` variants
/// of the KV write, the decode attention (fused and not) and the flash prefill.
pub(super) struct Fp8Kernels {
    pub(super) kv_write: CudaFunction,
    pub(super) decode: [CudaFunction; 4],
    pub(super) decode_fused: Option<[CudaFunction; 4]>,
    pub(super) prefill_flash: [CudaFunction; 4],
}

/// The pinned buffer uploads go through, and the event after the copy that last read it.
#[derive(Default)]
pub(crate) struct Staging(
    pub(super) parking_lot::Mutex<Option<(PinnedHostSlice<u32>, Option<CudaEvent>)>>,
);
