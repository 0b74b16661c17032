//! `EngineFlags`: the command-line face of [`EngineOptions`], shared by the CLI and the HTTP
//! host so both size an engine with the same flags and names.

use super::{DTypeChoice, DeviceChoice, EngineOptions, KvBudget};

/// Flags that size and configure an engine (`--device`, `--gpu-memory-utilization`, ...).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct EngineFlags {
    /// Device: auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
    /// Compute dtype: auto (the checkpoint's on CUDA, f32 on the CPU), f32, bf16, f16.
    #[arg(long, default_value = "auto")]
    pub dtype: DTypeChoice,
    /// Fraction of the GPU memory free after loading the weights that KV blocks take.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// KV memory in GiB (GPU or CPU), instead of the fraction.
    #[arg(long)]
    pub kv_cache_gib: Option<f64>,
    /// Most sequences decoding at once (default: 256 on a GPU, 64 on the CPU; never more
    /// than the KV blocks can hold).
    #[arg(long)]
    pub max_running: Option<usize>,
    /// Most tokens in one forward (decode tokens first, then prefill chunks).
    #[arg(long, default_value_t = 8192)]
    pub max_batched_tokens: usize,
    /// Largest prefill chunk of one sequence per step.
    #[arg(long, default_value_t = 2048)]
    pub prefill_chunk: usize,
    /// Tokens per KV block (tensor-parallel workers must use the same).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Turn the radix prefix cache off.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Host memory (GiB) for KV swapped out on preemption (0: preempt by recompute).
    #[arg(long, default_value_t = 4.0)]
    pub swap_gib: f64,
    /// Run decode steps eagerly instead of replaying CUDA graphs (debugging, comparisons).
    #[arg(long)]
    pub no_cuda_graphs: bool,
    /// Launch each decode step before the previous step's tokens reach the host
    /// (`EngineOptions::pipelined_decode`).
    #[arg(long)]
    pub pipelined_decode: bool,
}

impl Default for EngineFlags {
    fn default() -> Self {
        Self {
            device: DeviceChoice::Auto,
            dtype: DTypeChoice::Auto,
            gpu_memory_utilization: 0.9,
            kv_cache_gib: None,
            max_running: None,
            max_batched_tokens: 8192,
            prefill_chunk: 2048,
            block_size: 16,
            no_prefix_cache: false,
            swap_gib: 4.0,
            no_cuda_graphs: false,
            pipelined_decode: false,
        }
    }
}

impl EngineFlags {
    /// The engine options these flags describe.
    pub fn options(&self) -> EngineOptions {
        let on_gpu = match self.device {
            DeviceChoice::Cpu => false,
            DeviceChoice::Cuda(_) => true,
            DeviceChoice::Auto => candle_core::utils::cuda_is_available(),
        };
        let kv_budget = KvBudget {
            gpu_fraction: self.gpu_memory_utilization.clamp(0.0, 1.0),
            gpu_gib: self.kv_cache_gib,
            cpu_gib: self.kv_cache_gib.unwrap_or(KvBudget::default().cpu_gib),
            blocks: None,
        };
        EngineOptions {
            device: self.device,
            dtype: self.dtype,
            block_size: self.block_size,
            kv_budget,
            max_running: self.max_running.unwrap_or(if on_gpu { 256 } else { 64 }),
            max_batched_tokens: self.max_batched_tokens,
            prefill_chunk: self.prefill_chunk,
            prefix_cache: !self.no_prefix_cache,
            swap_gib: self.swap_gib,
            cuda_graphs: !self.no_cuda_graphs,
            pipelined_decode: self.pipelined_decode,
            ..EngineOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineFlags,
    }

    #[test]
    fn flags_become_engine_options_with_the_same_names() {
        let cli = Cli::parse_from([
            "x",
            "--device",
            "cpu",
            "--dtype",
            "bf16",
            "--kv-cache-gib",
            "2",
            "--max-running",
            "7",
            "--max-batched-tokens",
            "300",
            "--prefill-chunk",
            "100",
            "--block-size",
            "32",
            "--no-prefix-cache",
            "--swap-gib",
            "0",
            "--no-cuda-graphs",
            "--pipelined-decode",
        ]);
        let o = cli.engine.options();
        assert_eq!(o.device, DeviceChoice::Cpu);
        assert_eq!(o.dtype, DTypeChoice::BF16);
        assert_eq!((o.kv_budget.gpu_gib, o.kv_budget.cpu_gib), (Some(2.0), 2.0));
        assert_eq!(
            (o.max_running, o.max_batched_tokens, o.prefill_chunk),
            (7, 300, 100)
        );
        assert_eq!((o.block_size, o.prefix_cache, o.swap_gib), (32, false, 0.0));
        assert!(!o.cuda_graphs);
        assert!(o.pipelined_decode);
        // Defaults: 90% of free GPU memory; 64 sequences on the CPU.
        let d = Cli::parse_from(["x", "--device", "cpu"]).engine.options();
        assert_eq!((d.kv_budget.gpu_fraction, d.max_running), (0.9, 64));
        assert!(d.cuda_graphs);
        assert!(!d.pipelined_decode);
    }
}
