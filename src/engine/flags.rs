//! `EngineFlags`: the command-line face of [`EngineOptions`], shared by the CLI and the HTTP
//! host so both size an engine with the same flags and names.

use super::defaults;
use super::device::{DTypeChoice, DeviceChoice, KvBudget};
pub use super::kernel_flags::KernelFlags;
use super::options::{EngineOptions, SpeculativeMethod, SpeculativeOptions};

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
    #[arg(long, default_value_t = defaults::GPU_MEMORY_UTILIZATION)]
    pub gpu_memory_utilization: f64,
    /// KV memory in GiB (GPU or CPU), instead of the fraction.
    #[arg(long)]
    pub kv_cache_gib: Option<f64>,
    /// Most sequences decoding at once (default: derived from the KV pool on a GPU, its
    /// tokens / 1024 within 64..=1024; 64 on the CPU; the start-up line says which).
    #[arg(long)]
    pub max_running: Option<usize>,
    /// The largest decode batch replayed as a CUDA graph (larger ones run eagerly).
    #[arg(long, default_value_t = defaults::MAX_GRAPH_BATCH)]
    pub max_graph_batch: usize,
    /// Most tokens in one forward (decode tokens first, then prefill chunks).
    #[arg(long, default_value_t = defaults::MAX_BATCHED_TOKENS)]
    pub max_batched_tokens: usize,
    /// Largest prefill chunk of one sequence per step.
    #[arg(long, default_value_t = defaults::PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// Tokens per KV block (tensor-parallel workers must use the same).
    #[arg(long, default_value_t = defaults::BLOCK_SIZE)]
    pub block_size: usize,
    /// Turn the radix prefix cache off.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Host memory (GiB) for KV below the GPU: prefixes the GPU's prefix cache evicts, and
    /// sequences swapped out on preemption, one pool (0: neither; preemption recomputes).
    #[arg(long, alias = "swap-gib", default_value_t = defaults::KV_HOST_GIB)]
    pub kv_host_gib: f64,
    /// A directory for the disk KV tier (blocks the host tier lets go; kept across restarts
    /// over the same weights). Off when absent.
    #[arg(long)]
    pub kv_disk_dir: Option<std::path::PathBuf>,
    /// The disk KV tier's cap (GiB).
    #[arg(long, default_value_t = defaults::KV_DISK_GIB)]
    pub kv_disk_gib: f64,
    /// When a prompt's blocks found in host or disk are loaded back rather than recomputed.
    #[arg(long, value_enum, default_value_t = super::options::KvLoad::Measured)]
    pub kv_load: super::options::KvLoad,
    /// How the KV cache stores K and V: `auto` (the compute dtype), `bf16`, or `fp8` (e4m3
    /// with per-layer scales from the checkpoint or a start-up calibration: twice the tokens).
    #[arg(long, value_enum, default_value_t = super::options::KvCacheDtype::Auto)]
    pub kv_cache_dtype: super::options::KvCacheDtype,
    /// In how many parts of the vocabulary a wide grammar mask is computed at once (one
    /// thread each). Default: 1, never split (measured fastest on the H200 host).
    #[arg(long)]
    pub grammar_mask_parts: Option<usize>,
    /// Walk every token inside JSON strings with `maxLength` as llguidance does, instead of
    /// masking by the room left (turns `EngineOptions::grammar_bounded_strings` off; same masks,
    /// for comparisons).
    #[arg(long)]
    pub no_grammar_bounded_strings: bool,
    /// Fast-forward the tokens a grammar forces, several per forward, as drafts the masked
    /// draw keeps (`EngineOptions::grammar_fast_forward`; same tokens). On by default;
    /// `--grammar-fast-forward false` turns it off.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub grammar_fast_forward: bool,
    /// Most running sequences at which forced tokens are fast-forwarded
    /// (`EngineOptions::grammar_fast_forward_max_batch`).
    #[arg(long, default_value_t = 4)]
    pub grammar_fast_forward_max_batch: usize,
    /// Run decode steps eagerly instead of replaying CUDA graphs (debugging, comparisons).
    #[arg(long)]
    pub no_cuda_graphs: bool,
    /// Under tensor parallelism, capture and replay decode graphs on every rank too
    /// (`EngineOptions::tp_graphs`; unmeasured, off by default).
    #[arg(long)]
    pub tp_graphs: bool,
    /// Wait for each decode step's tokens before launching the next (turns
    /// `EngineOptions::pipelined_decode` off).
    #[arg(long)]
    pub no_pipelined_decode: bool,
    /// Log where each step's time goes, summed over this many steps (0: no profile).
    #[arg(long, default_value_t = 0)]
    pub profile_steps: u64,
    /// Speculative decoding: `ngram` (prompt lookup, the default), `draft` (a draft model,
    /// `--speculative-model`) or `none` (off).
    #[arg(long, default_value = "ngram", value_parser = ["none", "ngram", "draft"])]
    pub speculative_method: String,
    /// The draft model's directory for `--speculative-method draft` (the same tokenizer as
    /// the served model).
    #[arg(long)]
    pub speculative_model: Option<std::path::PathBuf>,
    /// Most draft tokens per sequence and step.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub num_speculative_tokens: u64,
    /// The n-gram lengths matched, MIN,MAX (longest first).
    #[arg(long, default_value = "2,4", value_parser = parse_ngram)]
    pub speculative_ngram: (usize, usize),
    /// Speculation pauses while more sequences than this run.
    #[arg(long, default_value_t = 8)]
    pub speculative_max_batch: usize,
    /// A sequence whose drafts all failed decodes its next steps without drafts (1, 3, 7,
    /// then 15 steps as the failures repeat). On by default; `--speculative-backoff false`
    /// drafts every step.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub speculative_backoff: bool,
    /// Reserve LoRA adapter slots (`EngineOptions::lora`; on by itself for a model that
    /// serves `--adapter`s).
    #[arg(long)]
    pub enable_lora: bool,
    /// LoRA adapters resident on the device at once (more wait in host memory).
    #[arg(long, default_value_t = defaults::MAX_LORAS)]
    pub max_loras: usize,
    /// The largest LoRA rank served.
    #[arg(long, default_value_t = defaults::MAX_LORA_RANK)]
    pub max_lora_rank: usize,
    /// Split a mixture-of-experts model's experts whole across the `--world-size` ranks
    /// (expert parallelism; attention stays tensor-parallel). Every rank needs the same.
    #[arg(long)]
    pub expert_parallel: bool,
    /// Which of the engine's own kernels run (`--no-kernels`, `--no-gemv`, ...).
    #[command(flatten)]
    pub kernels: KernelFlags,
}

/// `MIN,MAX` n-gram lengths: 1 <= MIN <= MAX <= 16.
fn parse_ngram(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once(',').ok_or("expected MIN,MAX (e.g. 2,4)")?;
    let parse = |x: &str| x.trim().parse::<usize>().map_err(|e| format!("`{x}`: {e}"));
    let (min, max) = (parse(a)?, parse(b)?);
    if min == 0 || min > max || max > 16 {
        return Err(format!("need 1 <= MIN <= MAX <= 16, got {min},{max}"));
    }
    Ok((min, max))
}

impl Default for EngineFlags {
    fn default() -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            flags: EngineFlags,
        }
        // The defaults clap gives: one table (`defaults`), no second copy here.
        Only::parse_from(["policy-serve"]).flags
    }
}

impl EngineFlags {
    /// The engine options these flags describe.
    pub fn options(&self) -> EngineOptions {
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
            max_running: self.max_running,
            max_graph_batch: self.max_graph_batch,
            max_batched_tokens: self.max_batched_tokens,
            prefill_chunk: self.prefill_chunk,
            prefix_cache: !self.no_prefix_cache,
            kv_host_gib: self.kv_host_gib,
            kv_disk: self
                .kv_disk_dir
                .clone()
                .map(|dir| super::options::KvDiskOptions {
                    dir,
                    gib: self.kv_disk_gib,
                }),
            kv_load: self.kv_load,
            kv_dtype: self.kv_cache_dtype,
            cuda_graphs: !self.no_cuda_graphs,
            tp_graphs: self.tp_graphs,
            pipelined_decode: !self.no_pipelined_decode,
            profile_steps: (self.profile_steps > 0).then_some(self.profile_steps),
            speculative: Some(self.speculative_method.as_str())
                .filter(|m| *m != "none")
                .map(|m| SpeculativeOptions {
                    method: if m == "draft" {
                        SpeculativeMethod::Draft
                    } else {
                        SpeculativeMethod::Ngram {
                            min: self.speculative_ngram.0,
                            max: self.speculative_ngram.1,
                        }
                    },
                    num_tokens: self.num_speculative_tokens as usize,
                    max_batch: self.speculative_max_batch,
                    backoff: self.speculative_backoff,
                }),
            speculative_model: self.speculative_model.clone(),
            lora: self.enable_lora.then_some(super::options::LoraOptions {
                max_loras: self.max_loras,
                max_lora_rank: self.max_lora_rank,
            }),
            grammar_mask_parts: self.grammar_mask_parts,
            grammar_bounded_strings: !self.no_grammar_bounded_strings,
            grammar_fast_forward: self.grammar_fast_forward,
            grammar_fast_forward_max_batch: self.grammar_fast_forward_max_batch,
            expert_parallel: self.expert_parallel,
            kernels: self.kernels.options(),
            ..EngineOptions::default()
        }
    }
}

/// The engine flags as a whole command line, for the flags' tests (here and `kernel_flags`).
#[cfg(test)]
pub(crate) mod test_cli {
    /// A command line of the engine flags alone.
    #[derive(clap::Parser)]
    pub(crate) struct Cli {
        #[command(flatten)]
        pub(crate) engine: super::EngineFlags,
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::engine::options::KernelOptions;

    use super::test_cli::Cli;

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
            "--no-pipelined-decode",
        ]);
        let o = cli.engine.options();
        assert_eq!(o.device, DeviceChoice::Cpu);
        assert_eq!(o.dtype, DTypeChoice::BF16);
        assert_eq!((o.kv_budget.gpu_gib, o.kv_budget.cpu_gib), (Some(2.0), 2.0));
        assert_eq!(
            (o.max_running, o.max_batched_tokens, o.prefill_chunk),
            (Some(7), 300, 100)
        );
        assert_eq!(
            (o.block_size, o.prefix_cache, o.kv_host_gib),
            (32, false, 0.0)
        );
        assert!(!o.cuda_graphs);
        assert!(!o.pipelined_decode);
        // Defaults: 90% of free GPU memory; the engine sizes max_running.
        let d = Cli::parse_from(["x", "--device", "cpu"]).engine.options();
        assert_eq!((d.kv_budget.gpu_fraction, d.max_running), (0.9, None));
        assert!(d.cuda_graphs);
        assert!(d.pipelined_decode);
        assert_eq!(d.kernels, KernelOptions::default());
        assert_eq!(d.kv_dtype, EngineOptions::default().kv_dtype);
        // One table: the flags' defaults are `EngineOptions::default()`'s (a mutation of
        // either side's batching defaults fails here).
        let lib = EngineOptions::default();
        assert_eq!(
            (
                d.max_batched_tokens,
                d.prefill_chunk,
                d.block_size,
                d.kv_host_gib,
                d.max_graph_batch
            ),
            (
                lib.max_batched_tokens,
                lib.prefill_chunk,
                lib.block_size,
                lib.kv_host_gib,
                lib.max_graph_batch
            )
        );
        assert_eq!(d.kv_budget, lib.kv_budget);
        let k = Cli::parse_from(["x", "--profile-steps", "5"])
            .engine
            .options();
        assert_eq!(k.profile_steps, Some(5));
        assert!(d.grammar_bounded_strings && lib.grammar_bounded_strings);
        assert!(d.grammar_fast_forward && lib.grammar_fast_forward);
        assert_eq!(
            (
                d.grammar_fast_forward_max_batch,
                lib.grammar_fast_forward_max_batch
            ),
            (4, 4)
        );
        let g = Cli::parse_from([
            "x",
            "--no-grammar-bounded-strings",
            "--grammar-fast-forward",
            "false",
            "--grammar-fast-forward-max-batch",
            "2",
        ])
        .engine
        .options();
        assert!(!g.grammar_bounded_strings && !g.grammar_fast_forward);
        assert_eq!(g.grammar_fast_forward_max_batch, 2);
        // Stages 2-4 only, refused at parsing with the range named.
        let bad = Cli::try_parse_from(["x", "--mma-decode-stages", "5"])
            .err()
            .map(|e| e.to_string());
        assert!(
            bad.is_some_and(|e| e.contains("2..=4")),
            "--mma-decode-stages 5"
        );
        let t = Cli::parse_from([
            "x",
            "--kv-host-gib",
            "2",
            "--kv-disk-dir",
            "/tmp/kv",
            "--kv-disk-gib",
            "3",
            "--kv-load",
            "never",
            "--kv-cache-dtype",
            "fp8",
        ])
        .engine
        .options();
        assert_eq!(t.kv_host_gib, 2.0);
        assert_eq!(
            t.kv_disk,
            Some(super::super::options::KvDiskOptions {
                dir: "/tmp/kv".into(),
                gib: 3.0
            })
        );
        assert_eq!(t.kv_load, super::super::options::KvLoad::Never);
        assert_eq!(t.kv_dtype, super::super::options::KvCacheDtype::Fp8);
        assert_eq!(
            d.kv_disk, None,
            "the disk tier is off unless a directory is given"
        );
    }
}
