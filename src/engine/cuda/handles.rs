//! Handles that `CudaKernels` holds and the launch files use (kept apart so that those files
//! and `kernels.rs` do not import from each other).

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaEvent, CudaFunction, CudaModule, PinnedHostSlice,
};

/// The MoE kernels (`kernels/moe.cu`): routing and sums `[bf16, f32]`; the experts' matmuls
/// on CUDA cores `[bf16 tile 8, f32 tile 8, f32 tile 32, bf16 tile 1]` and on tensor cores
/// (bf16) `[tile 16, tile 64]` (see `super::moe_ops::moe_tile`).
pub(super) struct MoeKernels {
    pub(super) _module: Arc<CudaModule>,
    pub(super) route: [CudaFunction; 2],
    pub(super) align: CudaFunction,
    pub(super) route_align: [CudaFunction; 2],
    pub(super) simt_gate_up: [CudaFunction; 4],
    pub(super) simt_down: [CudaFunction; 4],
    pub(super) mma_gate_up: [CudaFunction; 2],
    pub(super) mma_down: [CudaFunction; 2],
    pub(super) sum: [CudaFunction; 2],
}

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
