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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::engine::options::KernelOptions;

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
        let k = Cli::parse_from(["x", "--no-gemv", "--no-graph-pdl", "--profile-steps", "5"])
            .engine
            .options();
        assert!(!k.kernels.gemv && !k.kernels.graph_pdl && k.kernels.pdl);
        assert_eq!(k.profile_steps, Some(5));
        assert!(k.kernels.mma_decode);
        assert_eq!(k.kernels.mma_decode_stages, None);
        let m = Cli::parse_from(["x", "--no-mma-decode", "--mma-decode-stages", "3"])
            .engine
            .options();
        assert!(!m.kernels.mma_decode && !m.kernels.mma_decode_split_p);
        assert_eq!(m.kernels.mma_decode_stages, Some(3));
        let p = Cli::parse_from(["x", "--mma-decode-split-p"])
            .engine
            .options();
        assert!(p.kernels.mma_decode && p.kernels.mma_decode_split_p);
        // The lean fused decode attention: on unless turned off.
        assert!(d.kernels.fused_lean && lib.kernels.fused_lean);
        let l = Cli::parse_from(["x", "--no-fused-lean"]).engine.options();
        assert!(!l.kernels.fused_lean);
        // The fused attention's tensor-core loop: one stage for steps of up to 2 rows unless
        // turned off; stages 1-2 only.
        let one = Some(crate::engine::options::FUSED_MMA_STAGES);
        assert_eq!((d.kernels.fused_mma, lib.kernels.fused_mma), (one, one));
        assert_eq!(
            d.kernels.fused_mma_rows,
            crate::engine::options::FUSED_MMA_ROWS
        );
        let f = Cli::parse_from(["x", "--fused-mma", "2", "--fused-mma-rows", "1"])
            .engine
            .options();
        assert_eq!(
            (f.kernels.fused_mma, f.kernels.fused_mma_rows),
            (Some(2), 1)
        );
        let n = Cli::parse_from(["x", "--no-fused-mma"]).engine.options();
        assert_eq!(n.kernels.fused_mma, None);
        assert!(Cli::try_parse_from(["x", "--fused-mma", "3"]).is_err());
        // Long contexts unfused: past 2,048 tokens (6,144 at one row) unless told otherwise.
        assert_eq!(
            (d.kernels.fused_long_ctx, d.kernels.fused_long_ctx_one),
            (Some(2048), Some(6144))
        );
        let u = Cli::parse_from(["x", "--fused-long-ctx", "4096", "--fused-long-ctx-one", "9"])
            .engine
            .options();
        assert_eq!(
            (u.kernels.fused_long_ctx, u.kernels.fused_long_ctx_one),
            (Some(4096), Some(9))
        );
        let o = Cli::parse_from(["x", "--no-fused-long-ctx"])
            .engine
            .options();
        assert_eq!(
            (o.kernels.fused_long_ctx, o.kernels.fused_long_ctx_one),
            (None, None)
        );
        assert!(
            Cli::try_parse_from(["x", "--no-fused-long-ctx", "--fused-long-ctx", "1"]).is_err()
        );
        // The presummed norm: on unless turned off.
        assert!(d.kernels.norm_presum);
        let p = Cli::parse_from(["x", "--no-norm-presum"]).engine.options();
        assert!(!p.kernels.norm_presum);
        // The fused attention's row bound: 8 unless told otherwise; 0 and 17 refused.
        assert_eq!(d.kernels.fused_max_rows, 8);
        let r = Cli::parse_from(["x", "--fused-max-rows", "8"])
            .engine
            .options();
        assert_eq!(r.kernels.fused_max_rows, 8);
        assert!(Cli::try_parse_from(["x", "--fused-max-rows", "0"]).is_err());
        assert!(Cli::try_parse_from(["x", "--fused-max-rows", "17"]).is_err());
        assert!(Cli::try_parse_from(["x", "--no-fused-mma", "--fused-mma", "2"]).is_err());
        // The unnormed tensor-core skinny matmuls: on for weights of up to 6Mi elements unless
        // turned off; --gemv-mma (every kind) takes them over.
        let max = Some(crate::engine::options::GEMV_MMA_PLAIN_MAX_WEIGHT);
        assert_eq!(
            (d.kernels.gemv_mma_plain, lib.kernels.gemv_mma_plain),
            (max, max)
        );
        let g = Cli::parse_from(["x", "--gemv-mma-plain", "4096"])
            .engine
            .options();
        assert_eq!(g.kernels.gemv_mma_plain, Some(4096));
        assert!(!g.kernels.gemv_mma);
        let n = Cli::parse_from(["x", "--no-gemv-mma-plain"])
            .engine
            .options();
        assert_eq!(n.kernels.gemv_mma_plain, None);
        assert!(
            Cli::try_parse_from(["x", "--no-gemv-mma-plain", "--gemv-mma-plain", "64"]).is_err()
        );
        // MoE kernel switches: one-pair tiles on and the norm+router launch off by default.
        assert!(d.kernels.moe_tile_one && !d.kernels.moe_norm_router);
        let e = Cli::parse_from(["x", "--no-moe-tile-one", "--moe-norm-router"])
            .engine
            .options();
        assert!(!e.kernels.moe_tile_one && e.kernels.moe_norm_router);
        assert!(d.kernels.moe_down_sum && e.kernels.moe_down_sum && lib.kernels.moe_down_sum);
        let s = Cli::parse_from(["x", "--no-moe-down-sum"]).engine.options();
        assert!(!s.kernels.moe_down_sum && s.kernels.moe_tile_one);
        // The LoRA overlap on unless turned off, the grouped shrinks off unless asked for,
        // each apart from the other.
        assert!(d.kernels.lora_overlap && !d.kernels.lora_grouped && lib.kernels.lora_overlap);
        assert!(!lib.kernels.lora_grouped);
        let f = Cli::parse_from(["x", "--no-lora-overlap"]).engine.options();
        assert!(!f.kernels.lora_overlap && !f.kernels.lora_grouped);
        let g = Cli::parse_from(["x", "--lora-grouped"]).engine.options();
        assert!(g.kernels.lora_grouped && g.kernels.lora_overlap);
        // The run shrink: on unless turned off, apart from the other two.
        assert!(d.kernels.lora_runs && lib.kernels.lora_runs && g.kernels.lora_runs);
        let r = Cli::parse_from(["x", "--no-lora-runs"]).engine.options();
        assert!(!r.kernels.lora_runs && r.kernels.lora_overlap && !r.kernels.lora_grouped);
        // The norm's loads before the wait: on unless turned off, apart from the others; the
        // second stream's row bound: 64 (none) unless set.
        assert!(d.kernels.lora_norm_preload && lib.kernels.lora_norm_preload);
        let n = Cli::parse_from(["x", "--no-lora-norm-preload"])
            .engine
            .options();
        assert!(!n.kernels.lora_norm_preload && n.kernels.lora_overlap && n.kernels.lora_runs);
        assert_eq!(
            (d.kernels.lora_side_min_rows, lib.kernels.lora_side_min_rows),
            (64, 64)
        );
        let m = Cli::parse_from(["x", "--lora-side-min-rows", "16"])
            .engine
            .options();
        assert_eq!(m.kernels.lora_side_min_rows, 16);
        assert!(m.kernels.lora_norm_preload);
        // The shrinks inside the base matmuls from 3 rows unless turned off or bounded.
        assert_eq!(
            (d.kernels.lora_wide, lib.kernels.lora_wide),
            (Some(3), Some(3))
        );
        let w = Cli::parse_from(["x", "--no-lora-wide"]).engine.options();
        assert_eq!(w.kernels.lora_wide, None);
        assert!(w.kernels.lora_overlap && w.kernels.lora_runs);
        let w = Cli::parse_from(["x", "--lora-wide-min-rows", "1"]);
        assert_eq!(w.engine.options().kernels.lora_wide, Some(1));
        assert!(Cli::try_parse_from(["x", "--no-lora-wide", "--lora-wide-min-rows", "8"]).is_err());
        // Host tier loads through a staging copy unless asked to read the slots directly.
        assert!(!d.kernels.kv_load_direct && !g.kernels.kv_load_direct);
        let k = Cli::parse_from(["x", "--kv-load-direct"]).engine.options();
        assert!(k.kernels.kv_load_direct);
        // The streamed gate|up (2 blocks an SM) and the double-buffered long rows by default,
        // the two-warps-a-row long rows off; each switched apart; a grid size with the switch
        // that turns streaming off is refused.
        assert_eq!(d.kernels.gemv_stream, Some(2));
        assert_eq!(lib.kernels.gemv_stream, d.kernels.gemv_stream);
        assert!(d.kernels.gemv_double_buffer && lib.kernels.gemv_double_buffer);
        assert!(!d.kernels.gemv_split_k && !lib.kernels.gemv_split_k);
        let n = Cli::parse_from(["x", "--no-gemv-stream"]).engine.options();
        assert_eq!(n.kernels.gemv_stream, None);
        assert!(n.kernels.gemv_double_buffer);
        let n = Cli::parse_from(["x", "--gemv-stream", "3", "--no-gemv-double-buffer"]);
        let n = n.engine.options();
        assert_eq!(n.kernels.gemv_stream, Some(3));
        assert!(!n.kernels.gemv_double_buffer && !n.kernels.gemv_split_k);
        assert!(Cli::try_parse_from(["x", "--gemv-stream", "2", "--no-gemv-stream"]).is_err());
        assert!(Cli::try_parse_from(["x", "--gemv-stream", "0"]).is_err());
        let n = Cli::parse_from(["x", "--gemv-split-k"]).engine.options();
        assert!(n.kernels.gemv_split_k && n.kernels.gemv_double_buffer);
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
