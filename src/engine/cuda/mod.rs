//! The kernels room: the engine's own CUDA kernels (`kernels/*.cu`, compiled by `build.rs` to
//! fatbins with sm_80/sm_90 machine code and embedded here) and their launches on candle
//! tensors: attention (`attention.rs` decode, `verify.rs` speculative verify steps, `prefill.rs`
//! prefill), layer ops (`layer_ops.rs`),
//! the logits' draws, log-probs and penalty (`logits_ops.rs`), LoRA deltas (`lora_ops.rs`; grouped by
//! slot: `lora_grouped_ops.rs`; by runs of the tile table: `lora_runs.rs`; beside the base
//! matmuls: `lora_overlap.rs`; as extra columns of them: `lora_wide.rs`), matmuls
//! (`gemm.rs`; the 1-row matmul with its weights streamed into shared memory: `gemv_tma.rs`), the experts of MoE layers (`moe_ops.rs`, their router `moe_router.rs`, their handles `moe_handles.rs`), the launcher (`launch.rs`, its options `launch_options.rs`), the fp8 KV
//! kernels' handles (`fp8.rs`), output buffers and timing events (`buffers.rs`) and id read-back (`readback.rs`). It knows nothing of
//! models or serving: the forward built from these launches is `model::kernel_forward`, the
//! CUDA graphs that replay it are `runner::graphs`.
//!
//! Invariants: every launch goes on the device's one stream (candle's), reads and writes only
//! contiguous tensors it is given, and never synchronizes with the host; the `_into` variants
//! allocate nothing (they write buffers the caller owns), so a decode forward made of them can
//! be graph-captured (the one exception, the split-KV partials of a prefill launch, is never
//! part of a decode step). Every kernel waits on the one before it before it touches anything that
//! kernel may write (`launch.rs`). Only bf16 and f32 activations and head_dim 128 are served;
//! other models use the candle path.

mod attention;
mod attention_choice;
mod attention_handles;
mod blas;
mod buffers;
mod builds;
mod fp8;
mod gemm;
mod gemm_presum;
mod gemv_tma;
mod handles;
mod kernels;
mod launch;
mod launch_options;
mod layer_ops;
mod logits_ops;
mod lora_grouped_ops;
mod lora_ops;
mod lora_overlap;
mod lora_runs;
mod lora_wide;
mod moe_handles;
mod moe_ops;
mod moe_router;
mod params;
mod prefill;
mod readback;
#[cfg(feature = "timeline")]
pub mod timeline;
mod upload;
mod verify;

pub use attention::{CLUSTER_MAX_ROWS, DECODE_CLUSTER, FUSED_MAX_ROWS, GQA8_SPLIT_MAX_ROWS};
pub use buffers::GpuEvent;
pub use gemm_presum::presum_len;
pub use handles::GEMV_TMA_MAX_SLOTS;
pub use kernels::{CudaKernels, GEMV_MAX_ROWS, GEMV_MMA_MAX_ROWS, LaunchOptions};
pub(crate) use launch::kernel_err;
pub use launch_options::{MMA_STAGES_BF16, MMA_STAGES_FP8};
pub use logits_ops::GreedyScratch;
pub use lora_grouped_ops::{LORA_GROUPED_MIN_ROWS, LORA_GROUPED_SLICES, lora_scratch_cols};
pub use lora_ops::{LORA_TILE, LORA_TILE_ONE_MAX, lora_tile};
pub use lora_overlap::LORA_OVERLAP_MAX_RANK;
pub use lora_runs::LORA_RUNS_MIN_ROWS;
pub(crate) use moe_ops::MoeScratch;
pub use moe_ops::{MOE_TILE_ONE_MAX, MOE_TILES, moe_max_tiles, moe_tile};
pub use readback::PendingIds;
