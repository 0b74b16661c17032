//! The scheduler thread: owns the [`ModelRunner`] (model, KV tensors, worker link) and the
//! [`KvManager`] (KV memory), and runs continuous batching.
//!
//! Each loop: take new commands (block when idle), drop requests whose caller went away,
//! admit waiting requests (`memory.rs`), plan a step (`plan.rs`: one decode token for every
//! running sequence first, then prefill chunks up to the token budget), run it on the runner,
//! and process its output (`output.rs`: sampled tokens, incremental detokenization, stop
//! strings, streaming, finishing). A step that fails is retried sequence by sequence, so only
//! the failing request fails. With pipelined decode (`pipeline.rs`) a decode step is
//! read one loop later, behind the step launched after it.

mod detok;
mod memory;
mod output;
mod pipeline;
mod plan;
mod profile;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use parking_lot::Mutex;
use tokenizers::Tokenizer;

use super::comm::{RankSettings, WorkerCommand};
use super::config::ModelConfig;
use super::handle::{Replier, StreamSender};
use super::kv_cache::PagedKvCache;
use super::loader::{layer_progress, load_shard, served_context};
use super::qwen3::Shard;
use super::runner::ModelRunner;
use super::sampling::Rng;
use super::{EngineInfo, EngineOptions, EngineStats, Generation, GenerationRequest};
use crate::cache::KvManager;
use crate::error::{Error, Result};
use detok::Detokenizer;
use pipeline::InFlight;
use profile::StepProfile;

/// How long the head waits for its workers to load and say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(900);

pub(crate) enum Command {
    Generate {
        request: GenerationRequest,
        reply: Replier<Generation>,
    },
    GenerateStreaming {
        request: GenerationRequest,
        reply: Replier<Generation>,
        stream: StreamSender,
    },
    Score {
        tokens: Vec<u32>,
        reply: Replier<Vec<Vec<f32>>>,
    },
    Shutdown,
}

struct Seq {
    request: GenerationRequest,
    reply: Replier<Generation>,
    /// Prompt followed by the generated tokens.
    tokens: Vec<u32>,
    /// Tokens whose KV is in the cache.
    computed: usize,
    blocks: Vec<u32>,
    max_new: usize,
    rng: Rng,
    submitted: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    cached_prompt_tokens: usize,
    /// The radix node pinned for this sequence's cached prefix.
    pin: Option<usize>,
    /// KV of the computed tokens, swapped out to host memory (per layer K, V).
    swapped: Option<Vec<(Tensor, Tensor)>>,
    /// The generated text so far, decoded incrementally.
    detok: Detokenizer,
    /// Generated tokens not decoded yet (decoded while the GPU runs the next step).
    undecoded: Vec<u32>,
    /// Bytes of the text already searched for stop strings.
    stop_checked: usize,
    /// Times preempted.
    preemptions: u32,
    /// Where the text goes as it is generated, and how many bytes of it went.
    stream: Option<(StreamSender, usize)>,
}

impl Seq {
    fn prompt_len(&self) -> usize {
        self.request.prompt.len()
    }
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len()
    }
}

/// Whether decode steps should replay as CUDA graphs: the option, unless
/// `POLICY_SERVE_CUDA_GRAPHS=0`.
#[cfg(feature = "cuda")]
fn graphs_wanted(opts: &EngineOptions) -> bool {
    let env_off = std::env::var("POLICY_SERVE_CUDA_GRAPHS").is_ok_and(|v| v == "0");
    if opts.cuda_graphs && env_off {
        tracing::info!("POLICY_SERVE_CUDA_GRAPHS=0: decode steps run eagerly");
    }
    opts.cuda_graphs && !env_off
}

/// Whether decode steps run pipelined: the option, or `POLICY_SERVE_PIPELINED_DECODE`
/// (`1` on, `0` off) whatever it says.
fn pipelined_wanted(opts: &EngineOptions) -> bool {
    match std::env::var("POLICY_SERVE_PIPELINED_DECODE").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => opts.pipelined_decode,
    }
}

pub(crate) struct Scheduler {
    runner: ModelRunner,
    kv: KvManager,
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    opts: EngineOptions,
    info: EngineInfo,
    max_context: usize,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    stats: Arc<Mutex<EngineStats>>,
    cancelled: u64,
    profile: Option<StepProfile>,
    /// Pipelined decode on (`EngineOptions::pipelined_decode`, `pipeline.rs`).
    pipelined: bool,
    /// A step launched whose tokens are not read yet (pipelined decode).
    inflight: Option<InFlight>,
}

impl Scheduler {
    pub(crate) fn new(
        key: &str,
        cfg: &ModelConfig,
        weights: &[PathBuf],
        device: &Device,
        eos: &[u32],
        tokenizer: Arc<Tokenizer>,
        opts: &EngineOptions,
    ) -> Result<Self> {
        if opts.block_size == 0
            || opts.max_running == 0
            || opts.max_batched_tokens == 0
            || opts.prefill_chunk == 0
        {
            return Err(Error::InvalidInput(
                "block_size, max_running, max_batched_tokens and prefill_chunk must be positive"
                    .into(),
            ));
        }
        let comm = opts
            .tensor_parallel
            .as_ref()
            .map(|c| c.0.clone())
            .filter(|c| c.world_size() > 1);
        let shard = match &comm {
            Some(c) if c.rank() != 0 => {
                return Err(Error::InvalidInput(format!(
                    "rank {} runs `run_worker`, not an engine; only rank 0 serves",
                    c.rank()
                )));
            }
            Some(c) => Shard {
                rank: 0,
                world: c.world_size(),
            },
            None => Shard::FULL,
        };
        let pb = layer_progress(cfg.num_hidden_layers, key);
        let model = load_shard(key, cfg, weights, opts.dtype, device, shard, || pb.inc(1))?;
        pb.finish_and_clear();
        let dtype = model.dtype();
        let model_uses_kernels = model.uses_kernels();
        let max_context = served_context(cfg);
        // The graphs' buffers come before the KV cache is sized, so its budget counts them.
        #[cfg(feature = "cuda")]
        let graphs = if graphs_wanted(opts) && comm.is_none() {
            // Without room for the graphs' buffers the engine still serves, eagerly.
            super::cuda::DecodeGraphs::allocate(
                &model,
                opts.max_running,
                max_context,
                opts.block_size,
            )
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "no memory for CUDA graphs; decode steps run eagerly");
                None
            })
        } else {
            None
        };
        let block_bytes =
            cfg.kv_bytes_per_token(dtype.size_in_bytes()) * opts.block_size / shard.world;
        let max_useful = opts.max_running * max_context.div_ceil(opts.block_size);
        let num_blocks = opts
            .kv_budget
            .blocks_for(device, block_bytes)?
            .min(max_useful);
        if num_blocks == 0 {
            return Err(Error::Load {
                key: key.into(),
                reason: format!(
                    "the KV budget holds no block of {block_bytes} bytes; raise the KV budget"
                ),
            });
        }
        let cache = PagedKvCache::new(
            cfg,
            model.local_kv_heads(),
            num_blocks,
            opts.block_size,
            dtype,
            device,
        )?;
        if let Some(c) = &comm {
            // Every worker allocates the same blocks up front; the block tables of each step
            // travel with its command, so the ranks agree on slots and cached prefixes.
            let hello = WorkerCommand::Hello(RankSettings::new(cfg, opts, dtype, num_blocks));
            for (i, ack) in c
                .send_command(&hello, HELLO_TIMEOUT)?
                .into_iter()
                .enumerate()
            {
                ack.map_err(|e| {
                    Error::Engine(format!("worker rank {} refused to start: {e}", i + 1))
                })?;
            }
            tracing::info!(
                model = key,
                world = c.world_size(),
                "tensor-parallel workers ready"
            );
        }
        let prefix_cache = opts.prefix_cache
            && {
                let safe = cfg.kv_only_prefix_cache_is_safe();
                if !safe {
                    tracing::warn!(model = key, model_type = %cfg.model_type, reason = cfg.kv_only_reason(), "prefix cache requested but disabled: cached KV alone cannot restore this architecture's state");
                }
                safe
            };
        let swap = opts.swap_gib > 0.0
            && comm.is_none()
            && {
                let safe = cfg.kv_only_swap_out_is_safe();
                if !safe {
                    tracing::warn!(model = key, model_type = %cfg.model_type, reason = cfg.kv_only_reason(), "KV swap requested but disabled; preemption falls back to recompute");
                }
                safe
            };
        let swap_budget = if swap {
            (opts.swap_gib * (1u64 << 30) as f64) as usize
        } else {
            0
        };
        let kv = KvManager::new(
            num_blocks,
            opts.block_size,
            block_bytes,
            prefix_cache,
            swap_budget,
        );
        let stats = EngineStats {
            blocks_total: num_blocks,
            blocks_free: num_blocks,
            prefix_cache,
            ..Default::default()
        };
        #[allow(unused_mut)]
        let mut runner = ModelRunner::new(model, cache, comm, opts.worker_timeout);
        #[cfg(feature = "cuda")]
        let cuda_graph_buckets = runner.capture_graphs(graphs);
        #[cfg(not(feature = "cuda"))]
        let cuda_graph_buckets = Vec::new();
        Ok(Self {
            runner,
            kv,
            tokenizer,
            eos: eos.to_vec(),
            opts: opts.clone(),
            info: EngineInfo {
                key: key.to_string(),
                device: super::device::name(device),
                dtype,
                num_blocks,
                block_size: opts.block_size,
                max_context,
                vocab_size: cfg.vocab_size,
                default_max_new_tokens: opts.default_max_new_tokens,
                kernels: model_uses_kernels,
                cuda_graph_buckets,
            },
            max_context,
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: Arc::new(Mutex::new(stats)),
            cancelled: 0,
            profile: StepProfile::from_env(),
            pipelined: pipelined_wanted(opts),
            inflight: None,
        })
    }

    pub(crate) fn info(&self) -> &EngineInfo {
        &self.info
    }

    pub(crate) fn stats_handle(&self) -> Arc<Mutex<EngineStats>> {
        self.stats.clone()
    }

    pub(crate) fn run(mut self, rx: Receiver<Command>) {
        loop {
            let idle = self.running.is_empty() && self.waiting.is_empty();
            let t_top = Instant::now();
            let first = if idle {
                match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => break,
                }
            } else {
                match rx.recv_timeout(Duration::ZERO) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            };
            let mut shutdown = false;
            for cmd in first
                .into_iter()
                .chain(std::iter::from_fn(|| rx.try_recv().ok()))
            {
                match cmd {
                    Command::Generate { request, reply } => self.enqueue(request, reply, None),
                    Command::GenerateStreaming {
                        request,
                        reply,
                        stream,
                    } => self.enqueue(request, reply, Some(stream)),
                    Command::Score { tokens, reply } => {
                        self.settle();
                        reply.send(self.score(&tokens))
                    }
                    Command::Shutdown => shutdown = true,
                }
            }
            if shutdown {
                break;
            }
            // A step in flight is settled before admission (pipeline.rs; `drop_abandoned`
            // settles it itself before a running sequence goes).
            if !self.waiting.is_empty() {
                self.settle();
            }
            self.drop_abandoned();
            self.admit();
            let t_step = Instant::now();
            let running = self.running.len();
            if running > 0 {
                self.step();
            }
            let t_post = Instant::now();
            self.publish_stats();
            if running > 0
                && let Some(p) = &mut self.profile
            {
                p.record(t_step - t_top, t_post - t_step, t_post.elapsed(), running);
            }
        }
        if let Some(c) = self.runner.comm() {
            // Head shutdown stops every worker.
            if let Err(e) = c.send_command(&WorkerCommand::Shutdown, Duration::from_secs(10)) {
                tracing::warn!(error = %e, "could not tell every worker to shut down");
            }
        }
        tracing::debug!("scheduler stopped");
    }

    fn publish_stats(&self) {
        let kv = self.kv.stats();
        let mut s = self.stats.lock();
        s.running = self.running.len();
        s.waiting = self.waiting.len();
        s.blocks_free = kv.blocks_free;
        s.requests_cancelled = self.cancelled;
        if let Some(c) = kv.cache {
            s.cache_lookups = c.lookups;
            s.cache_lookup_tokens = c.lookup_tokens;
            s.cache_hit_tokens = c.hit_tokens;
            s.cache_hit_rate = c.hit_rate();
            s.evicted_blocks = c.evicted_blocks;
            s.cached_blocks = c.cached_blocks;
        }
        s.swap_used_bytes = kv.swap_used_bytes;
    }

    fn enqueue(
        &mut self,
        request: GenerationRequest,
        reply: Replier<Generation>,
        stream: Option<StreamSender>,
    ) {
        let max_new = request
            .max_new_tokens
            .unwrap_or(self.opts.default_max_new_tokens);
        if let Err(e) = self.info.check(&request) {
            self.stats.lock().requests_failed += 1;
            reply.send(Err(e));
            return;
        }
        let seed = request.sampling.seed;
        self.waiting.push_back(Seq {
            tokens: request.prompt.clone(),
            request,
            reply,
            computed: 0,
            blocks: Vec::new(),
            max_new,
            rng: Rng::new(seed),
            submitted: Instant::now(),
            admitted: None,
            first_token: None,
            cached_prompt_tokens: 0,
            pin: None,
            swapped: None,
            detok: Detokenizer::default(),
            undecoded: Vec::new(),
            stop_checked: 0,
            preemptions: 0,
            stream: stream.map(|s| (s, 0)),
        });
    }
}
