//! The defaults of every engine option, shared by `EngineOptions::default()` and
//! `EngineFlags` (so a library host and the CLI size an engine alike): one table.

/// Tokens per KV block.
pub const BLOCK_SIZE: usize = 16;
/// Most sequences decoding at once on the CPU.
pub const MAX_RUNNING_CPU: usize = 64;
/// On a GPU, `max_running` left to the engine is the KV pool's tokens over this (room for
/// every running sequence to hold a typical agent turn's context without preemption)...
pub const KV_TOKENS_PER_RUNNING: usize = 1024;
/// ... at least this many ...
pub const MAX_RUNNING_GPU_MIN: usize = 64;
/// ... and at most this many (vLLM's default on GPUs of the H100/H200 class).
pub const MAX_RUNNING_GPU_MAX: usize = 1024;
/// The largest batch whose decode steps replay as CUDA graphs (larger ones run eagerly):
/// graphs still pay at the largest batches on the H200 (0.6B: batch 512 39.6k vs 37.7k tok/s
/// eager, batch 1024 47.9k vs 46.7k; 1.7B batch 512 35.3k vs 33.9k), so up to the largest
/// derived `max_running`.
pub const MAX_GRAPH_BATCH: usize = 1024;
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
/// Host memory (GiB) for KV below the GPU (the host tier and swap, one pool).
pub const KV_HOST_GIB: f64 = 4.0;
/// The disk KV tier's cap (GiB) when `--kv-disk-dir` is given.
pub const KV_DISK_GIB: f64 = 64.0;
/// Fraction of the GPU memory free after loading the weights that KV blocks take.
pub const GPU_MEMORY_UTILIZATION: f64 = 0.9;
/// KV memory (GiB) on the CPU.
pub const CPU_KV_GIB: f64 = 1.0;
/// How long the head waits for workers to acknowledge a step (seconds).
pub const WORKER_TIMEOUT_SECS: u64 = 120;
/// LoRA adapters resident on the device at once (vLLM's `--max-loras` default is 1; agents'
/// fine-tunes come several at a time).
pub const MAX_LORAS: usize = 4;
/// The largest LoRA rank served (vLLM's default).
pub const MAX_LORA_RANK: usize = 16;

/// `max_running` when the options leave it to the engine, for a device (GPU or CPU) whose KV
/// pool holds `kv_tokens` tokens, and why (for the start-up line).
pub fn max_running(on_gpu: bool, kv_tokens: usize) -> (usize, String) {
    if !on_gpu {
        return (MAX_RUNNING_CPU, "the CPU default".into());
    }
    let n = (kv_tokens / KV_TOKENS_PER_RUNNING).clamp(MAX_RUNNING_GPU_MIN, MAX_RUNNING_GPU_MAX);
    (
        n,
        format!(
            "derived: a KV pool of {kv_tokens} tokens / {KV_TOKENS_PER_RUNNING} per sequence, \
             within {MAX_RUNNING_GPU_MIN}..={MAX_RUNNING_GPU_MAX}"
        ),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn max_running_follows_the_kv_pool_within_its_bounds() {
        // An H200 pool for Qwen3-0.6B/1.7B (~1.1M tokens): 1024, like vLLM there.
        assert_eq!(super::max_running(true, 1_160_000).0, 1024);
        assert_eq!(super::max_running(true, 300 * 1024).0, 300);
        assert_eq!(
            super::max_running(true, 1000).0,
            64,
            "small pools keep a floor"
        );
        assert_eq!(
            super::max_running(false, 1 << 30).0,
            64,
            "the CPU keeps its default"
        );
        assert!(
            super::max_running(true, 1_160_000)
                .1
                .contains("1160000 tokens")
        );
    }
}
