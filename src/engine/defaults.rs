//! The defaults of every engine option, shared by `EngineOptions::default()` and
//! `EngineFlags` (so a library host and the CLI size an engine alike): one table.

/// Tokens per KV block.
pub const BLOCK_SIZE: usize = 16;
/// Most sequences decoding at once on a GPU.
pub const MAX_RUNNING_GPU: usize = 256;
/// Most sequences decoding at once on the CPU.
pub const MAX_RUNNING_CPU: usize = 64;
/// Most tokens in one forward (decode tokens + prefill chunks).
pub const MAX_BATCHED_TOKENS: usize = 8192;
/// Largest prefill chunk of one sequence per step. Measured on the H200 (BENCHMARKS.md,
/// "Prefill at agent lengths"): a 32k-token prompt of 0.6B alone takes 353 ms in chunks of
/// 4096 against 368 ms in chunks of 2048 (8192 saved another 2.4% over 4096 in the sweep
/// before the last kernel change), and 8 sequences decoding beside it stall at most 72 ms per
/// step while it prefills (2048: 48 ms, 8192: 137 ms).
pub const PREFILL_CHUNK: usize = 4096;
/// Cap on generated tokens of a request that gives none (lowered to the room its prompt
/// leaves in the context).
pub const MAX_NEW_TOKENS: usize = 512;
/// Host memory (GiB) for KV swapped out on preemption.
pub const SWAP_GIB: f64 = 4.0;
/// Fraction of the GPU memory free after loading the weights that KV blocks take.
pub const GPU_MEMORY_UTILIZATION: f64 = 0.9;
/// KV memory (GiB) on the CPU.
pub const CPU_KV_GIB: f64 = 1.0;
/// How long the head waits for workers to acknowledge a step (seconds).
pub const WORKER_TIMEOUT_SECS: u64 = 120;

/// The default of `max_running` on a device: GPU or CPU.
pub fn max_running(on_gpu: bool) -> usize {
    if on_gpu {
        MAX_RUNNING_GPU
    } else {
        MAX_RUNNING_CPU
    }
}
