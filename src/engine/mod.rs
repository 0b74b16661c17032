//! The engine: one per loaded model, shared through a cheap `Clone` handle.
//!
//! [`Engine::generate`] may be called from many threads at once (and [`Engine::submit`]
//! awaited from async hosts). A scheduler thread owns the model and the KV memory and runs
//! continuous batching: admit, chunked prefill, one batched decode step for every running
//! sequence, sample, stop, release. A request that fails, fails alone.

mod attention;
mod blocks;
mod buckets;
pub mod comm;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
pub mod files;
mod flags;
mod handle;
pub mod kv_cache;
pub mod loader;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod qwen3;
mod runner;
pub mod sampling;
mod scheduler;
mod shard;
pub mod weights;
mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use candle_core::{DType, Device};
use parking_lot::Mutex;
use serde::Serialize;
use tokenizers::Tokenizer;

pub use buckets::{MAX_GRAPH_BUCKET, bucket_for, graph_buckets};
pub use comm::{CommBackend, CommHandle, InProcessComm, RankSettings, WorkerCommand, agree};
pub use config::{GenerationConfig, ModelConfig};
pub use device::{DTypeChoice, DeviceChoice, KvBudget};
pub use files::ModelFiles;
pub use flags::EngineFlags;
pub use handle::{NextChunk, Pending, TokenStream};
pub use sampling::SamplingParams;
pub use worker::{FailHook, WorkerOptions, WorkerReport, run_worker, spawn_in_process_workers};

use crate::error::{Error, Result};
use scheduler::{Command, Scheduler};

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
    /// Most sequences decoding at once.
    pub max_running: usize,
    /// Most tokens in one forward (decode tokens + prefill chunks).
    pub max_batched_tokens: usize,
    /// Largest prefill chunk of one sequence per step.
    pub prefill_chunk: usize,
    /// Default cap on generated tokens when a request gives none.
    pub default_max_new_tokens: usize,
    /// Reuse the KV of cached prefixes (radix tree). On by default; disabled with a warning
    /// for architectures whose state is not all in the KV.
    pub prefix_cache: bool,
    /// Host memory (GiB) for KV swapped out on preemption; 0 preempts by recompute.
    /// (Off under tensor parallelism: preemption recomputes.)
    pub swap_gib: f64,
    /// Tensor parallelism: this process's link to the other ranks (it must be rank 0; the
    /// others run [`run_worker`]). `None`: one rank.
    pub tensor_parallel: Option<CommHandle>,
    /// How long the head waits for workers to acknowledge a step.
    pub worker_timeout: Duration,
    /// Replay pure decode steps as CUDA graphs (captured at start-up per batch-size bucket up
    /// to `max_running`). On by default; CUDA with the engine's kernels and one rank only.
    /// `POLICY_SERVE_CUDA_GRAPHS=0` turns it off whatever this says.
    pub cuda_graphs: bool,
    /// Pipelined decode: a decode step of every running sequence is launched before the
    /// previous step's tokens reach the host (a CUDA graph copies them into its inputs on the
    /// device), so the GPU does not wait for the host between steps. The tokens are the same
    /// as without it (sampled requests draw the same numbers); a sequence that ends costs one
    /// dropped row of one step. Greedy and small top-k draws overlap; draws on the host (top_k
    /// absent or over 64) wait as before. Off by default (not yet measured on a GPU);
    /// `POLICY_SERVE_PIPELINED_DECODE=1` (or `0`) overrides this.
    pub pipelined_decode: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            device: DeviceChoice::Auto,
            dtype: DTypeChoice::Auto,
            block_size: 16,
            kv_budget: KvBudget::default(),
            max_running: 64,
            max_batched_tokens: 2048,
            prefill_chunk: 512,
            default_max_new_tokens: 512,
            prefix_cache: true,
            swap_gib: 4.0,
            tensor_parallel: None,
            worker_timeout: Duration::from_secs(120),
            cuda_graphs: true,
            pipelined_decode: false,
        }
    }
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// Prompt token ids (already rendered and tokenized).
    pub prompt: Vec<u32>,
    /// Cap on generated tokens (`None`: the engine default).
    pub max_new_tokens: Option<usize>,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop strings: generation ends when the text contains one (it is cut from the text).
    pub stop: Vec<String>,
    /// Keep generating past EOS tokens (benchmarks).
    pub ignore_eos: bool,
    /// Generate at least this many tokens: EOS and stop strings end nothing before (vLLM's
    /// `min_tokens`; must not exceed the cap).
    pub min_tokens: usize,
}

impl GenerationRequest {
    /// A greedy request for these prompt tokens.
    pub fn new(prompt: Vec<u32>) -> Self {
        Self {
            prompt,
            max_new_tokens: None,
            sampling: SamplingParams::greedy(),
            stop: vec![],
            ignore_eos: false,
            min_tokens: 0,
        }
    }

    /// Sets the cap on generated tokens.
    pub fn max_new_tokens(mut self, n: usize) -> Self {
        self.max_new_tokens = Some(n);
        self
    }

    /// Sets sampling.
    pub fn sampling(mut self, s: SamplingParams) -> Self {
        self.sampling = s;
        self
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token (`<|im_end|>`, `<|endoftext|>`).
    Eos,
    /// A stop string.
    Stop,
    /// The token cap.
    Length,
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Generation {
    /// Generated token ids (the EOS token included when it ended the generation).
    pub tokens: Vec<u32>,
    /// Generated text (EOS excluded, cut before a stop string).
    pub text: String,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_prompt_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Time waiting before admission.
    pub queue_time: Duration,
    /// Time from submission to the first generated token.
    pub time_to_first_token: Duration,
    /// Time from submission to the end.
    pub total_time: Duration,
    /// Times this request was preempted for lack of KV blocks (swapped out or recomputed).
    pub preemptions: u32,
}

/// Counters of an engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EngineStats {
    /// Requests finished (successfully or not).
    pub requests_finished: u64,
    /// Requests failed.
    pub requests_failed: u64,
    /// Requests dropped because their caller went away.
    pub requests_cancelled: u64,
    /// Sequences running now.
    pub running: usize,
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Forward steps run.
    pub steps: u64,
    /// Prompt tokens computed by prefill.
    pub prefill_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Sequences preempted for lack of KV blocks (swapped out, or requeued and recomputed).
    pub preemptions: u64,
    /// KV blocks in total.
    pub blocks_total: usize,
    /// KV blocks free.
    pub blocks_free: usize,
    /// Whether the prefix cache is on.
    pub prefix_cache: bool,
    /// Prefix-cache lookups.
    pub cache_lookups: u64,
    /// Prompt tokens looked up.
    pub cache_lookup_tokens: u64,
    /// Prompt tokens found in the cache.
    pub cache_hit_tokens: u64,
    /// `cache_hit_tokens / cache_lookup_tokens`.
    pub cache_hit_rate: f64,
    /// Blocks evicted from the prefix cache.
    pub evicted_blocks: u64,
    /// Blocks held by the prefix cache.
    pub cached_blocks: usize,
    /// Decode steps launched before the previous step's tokens were read (pipelined
    /// decode).
    pub pipelined_steps: u64,
    /// Sequences swapped out to host memory.
    pub swap_outs: u64,
    /// Sequences swapped back in.
    pub swap_ins: u64,
    /// Host bytes holding swapped KV now.
    pub swap_used_bytes: usize,
}

struct Inner {
    tx: Mutex<mpsc::Sender<Command>>,
    stats: Arc<Mutex<EngineStats>>,
    tokenizer: Arc<Tokenizer>,
    info: EngineInfo,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.tx.lock().send(Command::Shutdown);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

/// Facts about an engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineInfo {
    /// The model's key.
    pub key: String,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// Compute dtype.
    pub dtype: DType,
    /// KV blocks.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Longest context.
    pub max_context: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Cap on generated tokens of a request that gives none.
    pub default_max_new_tokens: usize,
    /// Whether the forward runs the engine's own CUDA kernels.
    pub kernels: bool,
    /// The batch sizes whose decode steps replay as CUDA graphs (empty: none do).
    pub cuda_graph_buckets: Vec<usize>,
}

impl EngineInfo {
    /// Checks a request against this engine (prompt not empty, token ids in the vocabulary,
    /// prompt + max new tokens within the context and the KV pool) without submitting it, so
    /// a host can refuse it before answering (e.g. before an SSE response starts). The engine
    /// runs the same check on submission.
    pub fn check(&self, r: &GenerationRequest) -> Result<()> {
        let max_new = r.max_new_tokens.unwrap_or(self.default_max_new_tokens);
        if r.min_tokens > max_new {
            return Err(Error::InvalidInput(format!(
                "min_tokens ({}) is over max_new_tokens ({max_new})",
                r.min_tokens
            )));
        }
        if r.prompt.is_empty() {
            return Err(Error::InvalidInput("the prompt is empty".into()));
        }
        self.check_vocab(&r.prompt)?;
        if max_new == 0 {
            return Err(Error::InvalidInput(
                "max_new_tokens must be at least 1".into(),
            ));
        }
        let need = r.prompt.len() + max_new;
        if need > self.max_context {
            return Err(Error::TooLarge(format!(
                "prompt ({} tokens) + max_new_tokens ({max_new}) = {need} exceeds the model's context of {} tokens; shorten the prompt or lower max_new_tokens",
                r.prompt.len(),
                self.max_context
            )));
        }
        let cap = self.num_blocks * self.block_size;
        if need > cap {
            return Err(Error::TooLarge(format!(
                "prompt ({} tokens) + max_new_tokens ({max_new}) = {need} tokens can never fit the KV pool of {} blocks x {} = {cap} tokens; raise the KV budget or lower max_new_tokens",
                r.prompt.len(),
                self.num_blocks,
                self.block_size
            )));
        }
        Ok(())
    }

    /// Every token id must index the embedding.
    pub fn check_vocab(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|&&t| t as usize >= self.vocab_size) {
            Some(bad) => Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary (size {})",
                self.vocab_size
            ))),
            None => Ok(()),
        }
    }
}

/// A cheap, clonable handle to a model's scheduler thread.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("info", &self.inner.info)
            .finish()
    }
}

impl Engine {
    /// Loads weights and starts the scheduler thread.
    pub fn load(
        key: &str,
        cfg: &ModelConfig,
        weights: &[PathBuf],
        tokenizer: Arc<Tokenizer>,
        eos_token_ids: &[u32],
        options: &EngineOptions,
    ) -> Result<Self> {
        let device = device::select(options.device)?;
        let sched = Scheduler::new(
            key,
            cfg,
            weights,
            &device,
            eos_token_ids,
            tokenizer.clone(),
            options,
        )?;
        let info = sched.info().clone();
        tracing::info!(
            model = key,
            device = %info.device,
            dtype = ?info.dtype,
            kv_blocks = info.num_blocks,
            kv_tokens = info.num_blocks * info.block_size,
            block_size = info.block_size,
            max_running = options.max_running,
            max_batched_tokens = options.max_batched_tokens,
            prefill_chunk = options.prefill_chunk,
            prefix_cache = options.prefix_cache,
            kernels = info.kernels,
            cuda_graphs = ?info.cuda_graph_buckets,
            "engine ready"
        );
        let stats = sched.stats_handle();
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("policy-serve-{key}"))
            .spawn(move || sched.run(rx))
            .map_err(|e| Error::Engine(format!("cannot start the scheduler thread: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                tx: Mutex::new(tx),
                stats,
                tokenizer,
                info,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// Facts about this engine.
    pub fn info(&self) -> &EngineInfo {
        &self.inner.info
    }

    /// Checks a request without submitting it (see [`EngineInfo::check`]).
    pub fn check(&self, request: &GenerationRequest) -> Result<()> {
        self.inner.info.check(request)
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// Tokenizes text as HF does for a rendered chat prompt (no added special tokens).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .tokenizer
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Submits a request; the returned [`Pending`] can be waited on or awaited.
    pub fn submit(&self, request: GenerationRequest) -> Pending<Generation> {
        let (reply, pending) = handle::channel();
        let _ = self
            .inner
            .tx
            .lock()
            .send(Command::Generate { request, reply });
        pending
    }

    /// Submits a request whose text also arrives chunk by chunk on the returned
    /// [`TokenStream`] (text held back while it could still become a stop string). Dropping
    /// the `Pending` cancels the request.
    pub fn submit_streaming(
        &self,
        request: GenerationRequest,
    ) -> (Pending<Generation>, TokenStream) {
        let (reply, pending) = handle::channel();
        let (sender, stream) = handle::stream();
        let _ = self.inner.tx.lock().send(Command::GenerateStreaming {
            request,
            reply,
            stream: sender,
        });
        (pending, stream)
    }

    /// Generates, blocking this thread until done. Safe to call from many threads at once.
    pub fn generate(&self, request: GenerationRequest) -> Result<Generation> {
        self.submit(request).wait()
    }

    /// Logits (f32) of every position of `tokens`: row i is the next-token distribution after
    /// `tokens[..=i]`.
    pub fn logits(&self, tokens: Vec<u32>) -> Result<Vec<Vec<f32>>> {
        let (reply, pending) = handle::channel();
        let _ = self.inner.tx.lock().send(Command::Score { tokens, reply });
        pending.wait()
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        self.inner.stats.lock().clone()
    }
}

/// The device of `choice`, for callers that build models themselves (benchmarks, tests).
pub fn select_device(choice: DeviceChoice) -> Result<Device> {
    device::select(choice)
}
