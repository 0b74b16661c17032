//! How an engine is built and how it batches: [`EngineOptions`], with the kernel switches in
//! [`KernelOptions`] and every default in [`super::defaults`] (the one table the CLI/HTTP flags and
//! `EngineOptions::default()` both read).
//!
//! Invariant: engine behaviour is chosen here, by typed fields; nothing in the engine reads an
//! environment variable.

use std::time::Duration;

use super::defaults;
use super::device::{DTypeChoice, DeviceChoice, KvBudget};
use super::parallel::comm::CommHandle;

pub use super::kernel_options::{
    FUSED_LONG_CTX, FUSED_LONG_CTX_MANY, FUSED_LONG_CTX_ONE, FUSED_MMA_ONE, FUSED_MMA_ROWS,
    FUSED_MMA_STAGES, FUSED_ROWS, GEMV_MMA_PLAIN_MAX_WEIGHT, GEMV_STREAM_BLOCKS, GEMV_TMA_MIN_K,
    GEMV_TMA_PIECES, GRAPH_SPLITS_FEW, GRAPH_SPLITS_MID, GRAPH_SPLITS_ONE, KernelOptions,
    LORA_SIDE_MIN_ROWS, LORA_WIDE_MIN_ROWS, NORM_DEFERRED_MAX_K, SMEM_CARVEOUT,
};

/// How an engine is built and how it batches.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// Where to run (`Auto`: CUDA if available, else CPU).
    pub device: DeviceChoice,
    /// Compute dtype (`Auto`: the checkpoint's on CUDA, f32 on CPU).
    pub dtype: DTypeChoice,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Memory for KV blocks.
    pub kv_budget: KvBudget,
    /// Most sequences decoding at once; `None`: derived by the engine from the device and
    /// its KV pool ([`defaults::max_running`]: on a GPU the pool's tokens / 1024, within
    /// 64..=1024; 64 on the CPU), logged at start-up with the reason and reported as
    /// `EngineInfo::max_running`.
    pub max_running: Option<usize>,
    /// The largest batch whose decode steps replay as CUDA graphs (buckets 1-8, powers of two
    /// to 256, then steps of 128, up to the one that holds `max_running`); larger decode
    /// steps run eagerly.
    pub max_graph_batch: usize,
    /// Most tokens in one forward (decode tokens + prefill chunks).
    pub max_batched_tokens: usize,
    /// Largest prefill chunk of one sequence per step.
    pub prefill_chunk: usize,
    /// Default cap on generated tokens when a request gives none (never more than the room
    /// its prompt leaves in the context).
    pub default_max_new_tokens: usize,
    /// Reuse the KV of cached prefixes (radix tree). On by default; disabled with a warning
    /// for architectures whose state is not all in the KV.
    pub prefix_cache: bool,
    /// Host memory (GiB) for KV below the GPU, one pool: prefixes the prefix cache evicts
    /// (the host tier) and sequences swapped out on preemption. 0: neither (preemption
    /// recomputes, evicted prefixes are dropped). Off under tensor parallelism.
    pub kv_host_gib: f64,
    /// The disk tier below the host tier (`None`: off, the default).
    pub kv_disk: Option<KvDiskOptions>,
    /// When admission loads a prompt's blocks back from host or disk rather than
    /// recomputing them.
    pub kv_load: KvLoad,
    /// How the KV cache stores K and V: the compute dtype (`Auto`, the default), bf16, or fp8
    /// e4m3 with a per-layer scale for K and for V (half the bytes of bf16: twice the tokens
    /// in the same memory). fp8 scales come from the checkpoint's `k_scale` / `v_scale`
    /// tensors when it has them, otherwise from a calibration pass over a fixed prompt at
    /// start-up (logged). One rank only; on CUDA with the flash prefill kernels (sm_89+).
    pub kv_dtype: KvCacheDtype,
    /// Tensor parallelism: this process's link to the other ranks (it must be rank 0; the
    /// others run `run_worker`). `None`: one rank.
    pub tensor_parallel: Option<CommHandle>,
    /// Expert parallelism for a mixture-of-experts model over `tensor_parallel`'s ranks: each
    /// rank holds `num_experts / world` whole experts (attention stays tensor-parallel);
    /// `false`: every rank holds a slice of every expert. Workers must be started with the
    /// same setting (`--expert-parallel`); a dense model refuses it.
    pub expert_parallel: bool,
    /// How long the head waits for workers to acknowledge a step.
    pub worker_timeout: Duration,
    /// Replay pure decode steps as CUDA graphs (captured at start-up per batch-size bucket up
    /// to `max_running`). On by default; CUDA with the engine's kernels.
    pub cuda_graphs: bool,
    /// With `cuda_graphs` under tensor parallelism, every rank captures and replays graphs (NCCL
    /// all-reduces in them). Off by default: not yet run on two GPUs; off, TP runs eagerly.
    pub tp_graphs: bool,
    /// Pipelined decode: a decode step of every running sequence is launched before the
    /// previous step's tokens reach the host (a CUDA graph copies them into its inputs), so the
    /// GPU does not wait for the host between steps; the same tokens (a sequence that ends
    /// costs one dropped row of one step). Greedy and small top-k draws overlap; draws on the
    /// host wait as before. On by default (measured on the H200: BENCHMARKS.md); the CPU path
    /// pipelines the same way (`tests/pipelined_decode.rs`).
    pub pipelined_decode: bool,
    /// Log the step profile (where a step's wall time goes) every this many steps; `None`:
    /// no profile.
    pub profile_steps: Option<u64>,
    /// Speculative decoding (see [`SpeculativeOptions`]; `None`: off). On by default with
    /// n-gram drafts and the backoff, at up to 8 running sequences: on the H200 drafts that
    /// hold make a step of 0.6B or 1.7B yield up to 3.3x / 3.9x the tokens of plain decoding
    /// (K = 4), transcripts whose repeats do not hold cost 2-4% with the backoff, and batches
    /// above 8 run as without it (BENCHMARKS.md, #24).
    pub speculative: Option<SpeculativeOptions>,
    /// The draft model's directory (Hugging Face layout) for
    /// [`SpeculativeMethod::Draft`]; it must share the target's tokenizer. Its KV cache holds
    /// as many tokens as the target's, out of the same KV budget.
    pub speculative_model: Option<std::path::PathBuf>,
    /// LoRA adapters over this engine's weights (`None`: off, the default; nothing is
    /// reserved for them).
    pub lora: Option<LoraOptions>,
    /// In how many parts of the vocabulary a wide grammar mask is computed at once, one
    /// thread each; the same mask either way. `None`: [`crate::grammar::default_mask_parts`]
    /// (1: never split, the measured best since masks inside bounded strings are cheap).
    /// Used when the first constrained request builds the engine's grammar compiler.
    pub grammar_mask_parts: Option<usize>,
    /// Inside a JSON string with `maxLength`, grammar masks allow the tokens that fit the room
    /// left at once and never walk the longer ones ([`crate::grammar::MaskOptions`]); the
    /// same masks either way. On by default; off only for a comparison.
    pub grammar_bounded_strings: bool,
    /// Fast-forward the tokens a grammar forces (positions whose mask allows one token: in a
    /// tool call, `{"name": "`, the keys, the separators; 41 of the 65 tokens of the grammar
    /// bench's two calls): they go into the step as drafts that the masked draw keeps, so one
    /// forward verifies them all and draws the token after them. Rides on speculative decoding
    /// (`speculative` set; requests without a repetition penalty) up to
    /// `grammar_fast_forward_max_batch` running sequences; the tokens are those of decoding
    /// one at a time. On by default: on the H200 constrained requests decoded 1.8x (0.6B) and
    /// 2.1x (1.7B) faster with it alone, 1.8x / 1.56x at batch 2, 1.19x / 1.08x at batch 4
    /// (BENCHMARKS.md, #26).
    pub grammar_fast_forward: bool,
    /// Most running sequences at which forced tokens are fast-forwarded (default 4: at batch
    /// 8 the verify rows cost more than the forced tokens save, 0.86x / 0.96x on the H200).
    pub grammar_fast_forward_max_batch: usize,
    /// The engine's own CUDA kernels.
    pub kernels: KernelOptions,
}

/// LoRA adapters: `max_loras` slots of rank `max_lora_rank` are reserved on the device at
/// start-up (before the KV cache is sized); adapters beyond them wait in host memory and
/// are moved in least-recently-used first when a request needs one (that request waits for
/// a free slot; nobody else does). Tensor-parallel engines do not serve adapters yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraOptions {
    /// Adapters resident on the device at once.
    pub max_loras: usize,
    /// The largest rank served; every slot is padded to it.
    pub max_lora_rank: usize,
}

impl Default for LoraOptions {
    fn default() -> Self {
        Self {
            max_loras: defaults::MAX_LORAS,
            max_lora_rank: defaults::MAX_LORA_RANK,
        }
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            device: DeviceChoice::Auto,
            dtype: DTypeChoice::Auto,
            block_size: defaults::BLOCK_SIZE,
            kv_budget: KvBudget::default(),
            max_running: None,
            max_graph_batch: defaults::MAX_GRAPH_BATCH,
            max_batched_tokens: defaults::MAX_BATCHED_TOKENS,
            prefill_chunk: defaults::PREFILL_CHUNK,
            default_max_new_tokens: defaults::MAX_NEW_TOKENS,
            prefix_cache: true,
            kv_host_gib: defaults::KV_HOST_GIB,
            kv_disk: None,
            kv_load: KvLoad::Measured,
            kv_dtype: KvCacheDtype::Auto,
            tensor_parallel: None,
            expert_parallel: false,
            worker_timeout: Duration::from_secs(defaults::WORKER_TIMEOUT_SECS),
            cuda_graphs: true,
            tp_graphs: false,
            pipelined_decode: true,
            profile_steps: None,
            speculative: Some(SpeculativeOptions::default()),
            speculative_model: None,
            lora: None,
            grammar_mask_parts: None,
            grammar_bounded_strings: true,
            grammar_fast_forward: true,
            grammar_fast_forward_max_batch: 4,
            kernels: KernelOptions::default(),
        }
    }
}

/// The disk KV tier: blocks the host tier lets go are written under `dir` (one file per block,
/// with a checksum), up to `gib`; a restarted engine over the same weights finds them.
#[derive(Debug, Clone, PartialEq)]
pub struct KvDiskOptions {
    /// The directory (created if needed).
    pub dir: std::path::PathBuf,
    /// Its cap in GiB.
    pub gib: f64,
}

/// When admission loads a prompt's blocks from host or disk rather than recomputing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KvLoad {
    /// When the copy is faster at the rates measured at start-up (host-to-device and disk
    /// bandwidth, prefill tokens per second; logged).
    #[default]
    Measured,
    /// Always (tests; comparisons).
    Always,
    /// Never: recompute.
    Never,
}

/// How the KV cache stores K and V (`EngineOptions::kv_dtype`, `--kv-cache-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KvCacheDtype {
    /// The compute dtype.
    #[default]
    Auto,
    /// bf16 (with a bf16 compute dtype; on the CPU with any).
    Bf16,
    /// fp8 e4m3 with per-layer K and V scales.
    Fp8,
}

/// Where draft tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeculativeMethod {
    /// Prompt lookup: the longest `min..=max`-token suffix of the sequence that occurred
    /// before in it (prompt and output) proposes the tokens that followed that occurrence.
    Ngram {
        /// Shortest suffix matched.
        min: usize,
        /// Longest suffix matched (tried first).
        max: usize,
    },
    /// A draft model (`EngineOptions::speculative_model`): a smaller Qwen3 with the same
    /// tokenizer drafts K tokens greedily, one forward a token, from its own paged KV cache.
    Draft,
}

/// Speculative decoding: a decode step feeds each eligible sequence its last token and up
/// to `num_tokens` drafted ones, and keeps the drafts the model's own choices confirm (its
/// argmax, or for a sampled request its draw at that position: rejection sampling of a
/// one-hot proposal), plus the model's next token: answers are token for token those
/// without it, greedy or seeded. Eligible: requests without a repetition penalty or a
/// grammar (their log-probs, when asked, come from the verifying rows; the others decode
/// as usual in the same step). On CUDA a step with drafts replays a decode graph with one
/// row per verified position when its rows fit a bucket; steps with drafts are not
/// pipelined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculativeOptions {
    /// Where drafts come from.
    pub method: SpeculativeMethod,
    /// Most draft tokens per sequence and step (K).
    pub num_tokens: usize,
    /// Speculation pauses while more sequences than this run (a big batch is bound by the
    /// weights' read, which drafts do not save).
    pub max_batch: usize,
    /// Back off a sequence whose drafts keep failing: after a verify step that kept none of
    /// its drafts it decodes the next 2^m - 1 steps without drafts (m: such verifies in a
    /// row, at most 4), so a transcript whose repeats do not hold costs about plain decoding.
    /// Answers are the same either way. On by default: with no draft ever kept, 0.96-0.98x
    /// plain decoding on the H200 instead of 0.64-0.81x without it (BENCHMARKS.md, #24).
    pub backoff: bool,
}

impl Default for SpeculativeOptions {
    fn default() -> Self {
        Self {
            method: SpeculativeMethod::Ngram { min: 2, max: 4 },
            num_tokens: 4,
            max_batch: 8,
            backoff: true,
        }
    }
}

/// Benchmarks only: drafts replayed from a known continuation of a request (the target's
/// own greedy output), each position's token replaced by another with probability
/// `corrupt` (decided once per position, by a hash of it).
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq)]
pub struct DraftReplay {
    /// The continuation: output token `i` is `tokens[i]`.
    pub tokens: Vec<u32>,
    /// The fraction of positions whose draft is wrong (0: every draft right).
    pub corrupt: f64,
}
