//! The bench's command line (`main.rs` runs it).

use std::path::PathBuf;

use clap::Parser;
use policy_serve::engine::{DTypeChoice, DeviceChoice};

/// Engine benchmark with random weights in a real Qwen3 shape.
#[derive(Parser, Debug)]
#[command(name = "bench")]
pub(crate) struct Args {
    /// A Qwen3 config.json (the shape of the random model).
    #[arg(long, default_value = "tests/fixtures/qwen3/config-0.6b.json")]
    pub(crate) config: PathBuf,
    /// Decode batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
    pub(crate) batches: Vec<usize>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 512)]
    pub(crate) prompt: usize,
    /// New tokens per sequence.
    #[arg(long = "new", default_value_t = 128)]
    pub(crate) new_tokens: usize,
    /// New tokens per sequence of the warm-up round before each measured batch (a constrained
    /// batch's matchers are the warm-up's, rewound: with as many tokens as measured, the
    /// measured wave runs on matchers that have built their lexer states, as a server's
    /// later waves do).
    #[arg(long, default_value_t = 4)]
    pub(crate) warmup_new: usize,
    /// Device: auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub(crate) device: DeviceChoice,
    /// Compute dtype: auto, f32, bf16, f16.
    #[arg(long, default_value = "auto")]
    pub(crate) dtype: DTypeChoice,
    /// Skip the candle-transformers peer.
    #[arg(long)]
    pub(crate) no_peer: bool,
    /// Override the number of layers.
    #[arg(long)]
    pub(crate) layers: Option<usize>,
    /// Agent workload: EPISODES,TURNS.
    #[arg(long, value_parser = parse_pair)]
    pub(crate) agent: Option<(usize, usize)>,
    /// Skip the decode/prefill/peer part.
    #[arg(long)]
    pub(crate) agent_only: bool,
    /// Keep the random model in this directory.
    #[arg(long)]
    pub(crate) keep: Option<PathBuf>,
    /// Write the random model to this directory and exit.
    #[arg(long)]
    pub(crate) write_model: Option<PathBuf>,
    /// Random weights of more than this many MiB are written as shards of about this size
    /// with a `model.safetensors.index.json`, one shard in memory at a time.
    #[arg(long, default_value_t = 4096)]
    pub(crate) shard_mib: usize,
    /// Use the model in this directory instead of writing one.
    #[arg(long)]
    pub(crate) model_dir: Option<PathBuf>,
    /// Tensor-parallel ranks (this process is rank 0; workers: `policy-serve worker`).
    #[arg(long, default_value_t = 1)]
    pub(crate) world_size: usize,
    /// Rendezvous of the tensor-parallel group.
    #[arg(long)]
    pub(crate) rendezvous: Option<std::net::SocketAddr>,
    /// Tensor parallelism on CUDA graphs on every rank (`EngineOptions::tp_graphs`).
    #[arg(long)]
    pub(crate) tp_graphs: bool,
    /// Print the greedy tokens of a fixed batch of prompts (to compare runs).
    #[arg(long)]
    pub(crate) greedy_check: bool,
    /// At the end: wait for the file /tmp/policy-serve-killed, then try one request.
    #[arg(long)]
    pub(crate) kill_test: bool,
    /// Check the NCCL backend with a group of one on this GPU.
    #[arg(long)]
    pub(crate) nccl_selftest: bool,
    /// Time bare model decode steps (no scheduler) at each batch size.
    #[arg(long)]
    pub(crate) profile_step: bool,
    /// After the decode rows, the same rows on an engine without CUDA graphs.
    #[arg(long)]
    pub(crate) compare_eager: bool,
    /// Prefill chunk in tokens (`EngineOptions::prefill_chunk`).
    #[arg(long, default_value_t = policy_serve::engine::defaults::PREFILL_CHUNK)]
    pub(crate) prefill_chunk: usize,
    /// Token budget of one step (`EngineOptions::max_batched_tokens`).
    #[arg(long, default_value_t = policy_serve::engine::defaults::MAX_BATCHED_TOKENS)]
    pub(crate) max_batched_tokens: usize,
    /// Also measure decode latency while one `--prompt`-token prompt prefills (8 streams).
    #[arg(long)]
    pub(crate) mixed: bool,
    /// No pipelined decode (`EngineOptions::pipelined_decode` off).
    #[arg(long)]
    pub(crate) no_pipelined_decode: bool,
    /// The largest decode batch replayed as a CUDA graph (`EngineOptions::max_graph_batch`).
    #[arg(long, default_value_t = policy_serve::engine::defaults::MAX_GRAPH_BATCH)]
    pub(crate) max_graph_batch: usize,
    /// Log the step profile every N steps (`EngineOptions::profile_steps`; 0: off).
    #[arg(long, default_value_t = 0)]
    pub(crate) profile_steps: u64,
    /// In how many parts a wide grammar mask is computed at once
    /// (`EngineOptions::grammar_mask_parts`; default 1: never split).
    #[arg(long)]
    pub(crate) grammar_mask_parts: Option<usize>,
    /// Walk every token inside JSON strings with `maxLength` as llguidance does
    /// (`EngineOptions::grammar_bounded_strings` off; the same masks, for comparisons).
    #[arg(long)]
    pub(crate) no_grammar_bounded_strings: bool,
    /// Fast-forward the tokens a grammar forces (`EngineOptions::grammar_fast_forward`) up
    /// to `--grammar-fast-forward-max-batch` running sequences; the engine then speculates as
    /// by default (the forced tokens ride on it), plain rows too.
    #[arg(long)]
    pub(crate) grammar_fast_forward: bool,
    /// Most running sequences at which forced tokens are fast-forwarded
    /// (`EngineOptions::grammar_fast_forward_max_batch`).
    #[arg(long, default_value_t = 4)]
    pub(crate) grammar_fast_forward_max_batch: usize,
    /// Also measure decode with every row constrained to tool calls (`tool_choice`
    /// required over tests/fixtures/tools/nested.json), printed as `constrained` rows.
    #[arg(long)]
    pub(crate) constrained: bool,
    /// LoRA adapters: write this many random adapters (rank `--adapter-rank`, all seven
    /// projections), load them (timed) and measure decode with row i on adapter i % N,
    /// printed as `lora` rows next to the base's `ours` rows of the same engine.
    #[arg(long, default_value_t = 0)]
    pub(crate) adapters: usize,
    /// Rank of `--adapters`' adapters (also the engine's `max_lora_rank`).
    #[arg(long, default_value_t = 16)]
    pub(crate) adapter_rank: usize,
    /// Host memory for KV below the GPU (`EngineOptions::kv_host_gib`; 0: the tiers off).
    #[arg(long, default_value_t = policy_serve::engine::defaults::KV_HOST_GIB)]
    pub(crate) kv_host_gib: f64,
    /// KV tiers: the time to first token of resuming one transcript of each of these lengths
    /// from the GPU, host memory, disk and by recompute (then exit).
    #[arg(long, value_delimiter = ',')]
    pub(crate) tiers_resume: Vec<usize>,
    /// How the KV cache stores K and V (`auto`, `bf16`, `fp8`).
    #[arg(long, value_enum, default_value_t = policy_serve::engine::KvCacheDtype::Auto)]
    pub(crate) kv_cache_dtype: policy_serve::engine::KvCacheDtype,
    /// Speculative decoding at chosen acceptance: for each K, drafts replayed from the
    /// model's own greedy continuation with `--spec-corrupt` fractions of positions wrong,
    /// each batch of `--batches` next to plain decode in the same engine (then exit).
    #[arg(long, value_delimiter = ',')]
    pub(crate) spec_ks: Vec<usize>,
    /// Fractions of replayed draft positions that are wrong (`--spec-ks`).
    #[arg(long, value_delimiter = ',', default_value = "1,0.5,0.2,0")]
    pub(crate) spec_corrupt: Vec<f64>,
    /// A draft model for `--spec-ks` (`SpeculativeMethod::Draft`): its rows draft with it
    /// (acceptance as measured) instead of replaying corrupted continuations.
    #[arg(long)]
    pub(crate) spec_draft: Option<PathBuf>,
    /// The backoff of sequences whose drafts fail (`SpeculativeOptions::backoff`; `--spec-ks`).
    #[arg(long)]
    pub(crate) spec_backoff: bool,
    /// Speculation pauses above this many running sequences (`--spec-ks`).
    #[arg(long, default_value_t = policy_serve::engine::SpeculativeOptions::default().max_batch)]
    pub(crate) spec_max_batch: usize,
    /// Kernel variants side by side in this process (then exit): each value a set of kernel
    /// flags (`""` for the defaults), an engine each in turn, `--variant-rounds` rounds of
    /// the decode rows of `--batches` (`variants.rs`). Kernel flags go inside the values.
    #[arg(long = "variant", value_name = "FLAGS", allow_hyphen_values = true)]
    pub(crate) variants: Vec<String>,
    /// Rounds of `--variant` (the variants interleaved in each).
    #[arg(long, default_value_t = 2)]
    pub(crate) variant_rounds: usize,
    /// The kernel switches (`--no-fused-decode`, `--no-clusters`, ...), as the CLI has them.
    #[command(flatten)]
    pub(crate) kernels: policy_serve::engine::KernelFlags,
}

fn parse_pair(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once(',').ok_or("expected N,T")?;
    Ok((
        a.parse().map_err(|e| format!("{e}"))?,
        b.parse().map_err(|e| format!("{e}"))?,
    ))
}
