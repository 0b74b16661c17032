//! The scheduler's state and loop: it owns the [`ModelRunner`] (model, KV tensors, worker
//! link) and the [`KvManager`] (KV memory), and runs continuous batching.
//!
//! Each loop: take new commands (block when idle), drop requests whose caller went away,
//! admit waiting requests (`memory.rs`), plan a step (`plan.rs`: one decode token for every
//! running sequence first, then prefill chunks up to the token budget), run it on the runner,
//! and process its output (`output.rs`: sampled tokens, incremental detokenization, stop
//! strings, streaming, finishing). A step that fails is retried sequence by sequence, so only
//! the failing request fails. With pipelined decode (`pipeline.rs`) a decode step is
//! read one loop later, behind the step launched after it.

use crate::grammar::Grammar;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use candle_core::Device;
use parking_lot::Mutex;
use tokenizers::Tokenizer;

use super::detok::Detokenizer;
use super::profile::StepProfile;
use super::seq::{Command, InFlight, PendingUpdate, Seq};
use crate::cache::KvManager;
use crate::engine::device;
use crate::engine::handle::{Replier, StreamSender};
use crate::engine::model::config::ModelConfig;
use crate::engine::options::EngineOptions;
use crate::engine::parallel::comm::WorkerCommand;
use crate::engine::request::{EngineInfo, EngineStats, Generation, GenerationRequest};
use crate::engine::runner::sampler::Rng;
use crate::engine::runner::{Loaded, ModelRunner};
use crate::engine::update::WeightsVersion;

/// The scheduler thread's state: the runner, the KV memory, the waiting and running
/// requests. Its behaviour is spread by concern over the files of this room, each an
/// `impl Scheduler` block: the loop (here), admission and preemption (`memory.rs`), planning
/// and running a step (`plan.rs`), output (`output.rs`), pipelined decode (`pipeline.rs`).
pub(crate) struct Scheduler {
    pub(super) runner: ModelRunner,
    pub(super) kv: KvManager,
    pub(super) tokenizer: Arc<Tokenizer>,
    pub(super) eos: Vec<u32>,
    pub(super) opts: EngineOptions,
    pub(super) info: EngineInfo,
    pub(super) max_context: usize,
    pub(super) waiting: VecDeque<Seq>,
    pub(super) running: Vec<Seq>,
    pub(super) stats: Arc<Mutex<EngineStats>>,
    pub(super) cancelled: u64,
    pub(super) profile: Option<StepProfile>,
    /// Pipelined decode on (`EngineOptions::pipelined_decode`, `pipeline.rs`).
    pub(super) pipelined: bool,
    /// A step launched whose tokens are not read yet (pipelined decode).
    pub(super) inflight: Option<InFlight>,
    /// The KV blocks free or cached (evictable, or reusable) when the last admission failed
    /// for lack of memory; `None` when the last admission pass did not fail on memory.
    /// Admission is retried once this grows (`admission_possible`).
    pub(super) kv_blocked_at: Option<usize>,
    /// The model's config (weight updates check names and shapes against it).
    pub(super) cfg: ModelConfig,
    /// The weights serving now.
    pub(super) weights: WeightsVersion,
    /// A weight update waiting for the old weights' requests (`weights.rs`).
    pub(super) update: Option<PendingUpdate>,
    /// LoRA adapters: registered, and resident in the device's slots (`adapters.rs`).
    pub(super) adapters: super::adapter_table::AdapterTable,
    /// Admitted sequences whose prefix is still being read from disk or copied back from the
    /// tiers below the GPU (`kv_tiers.rs`): they join `running` when their copy is done.
    pub(super) loading: Vec<(Seq, super::seq::Loading)>,
    /// The draft model of speculative decoding (`SpeculativeMethod::Draft`).
    pub(super) draft_model: Option<crate::engine::runner::draft::DraftRunner>,
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
    ) -> crate::error::Result<Self> {
        let Loaded {
            runner,
            dtype,
            kv_dtype,
            num_blocks,
            block_bytes,
            max_context,
            kernels,
            cuda_graph_buckets,
            world,
            max_running,
            max_running_why,
            digest,
            draft,
        } = ModelRunner::load(key, cfg, weights, device, opts)?;
        let prefix_cache = opts.prefix_cache
            && {
                let safe = cfg.kv_only_prefix_cache_is_safe();
                if !safe {
                    tracing::warn!(model = key, model_type = %cfg.model_type, reason = cfg.kv_only_reason(), "prefix cache requested but disabled: cached KV alone cannot restore this architecture's state");
                }
                safe
            };
        let swap = opts.kv_host_gib > 0.0
            && world == 1
            && {
                let safe = cfg.kv_only_swap_out_is_safe();
                if !safe {
                    tracing::warn!(model = key, model_type = %cfg.model_type, reason = cfg.kv_only_reason(), "KV swap requested but disabled; preemption falls back to recompute");
                }
                safe
            };
        let swap_budget = if swap {
            (opts.kv_host_gib * (1u64 << 30) as f64) as usize
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
        let weights = WeightsVersion {
            version: 0,
            digest,
            adapter: None,
        };
        let stats = EngineStats {
            blocks_total: num_blocks,
            blocks_free: num_blocks,
            prefix_cache,
            ..Default::default()
        };
        let mut s = Self {
            runner,
            kv,
            tokenizer,
            eos: eos.to_vec(),
            opts: EngineOptions {
                max_running: Some(max_running),
                ..opts.clone()
            },
            info: EngineInfo {
                key: key.to_string(),
                device: device::name(device),
                dtype,
                kv_dtype,
                num_blocks,
                block_size: opts.block_size,
                max_context,
                vocab_size: cfg.vocab_size,
                default_max_new_tokens: opts.default_max_new_tokens,
                kernels,
                cuda_graph_buckets,
                max_running,
                max_running_why,
                world_size: world,
                max_loras: opts.lora.map_or(0, |l| l.max_loras),
                max_lora_rank: opts.lora.map_or(0, |l| l.max_lora_rank),
            },
            max_context,
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: Arc::new(Mutex::new(stats)),
            cancelled: 0,
            profile: opts.profile_steps.and_then(StepProfile::every),
            pipelined: opts.pipelined_decode,
            inflight: None,
            kv_blocked_at: None,
            cfg: cfg.clone(),
            weights,
            update: None,
            adapters: super::adapter_table::AdapterTable::new(opts.lora.map_or(0, |l| l.max_loras)),
            loading: Vec::new(),
            draft_model: draft,
        };
        s.start_tiers(block_bytes, world);
        if let (true, Some(o)) = (s.pipelined, opts.speculative) {
            tracing::info!(
                max_batch = o.max_batch,
                "speculative decoding and pipelined decode are both on: while up to \
                 max_batch sequences run and one of them may draft (no grammar or repetition \
                 penalty, not backing off), steps are not pipelined (a verify step's tokens \
                 decide the next step's inputs); other steps run pipelined"
            );
        }
        Ok(s)
    }

    pub(crate) fn info(&self) -> &EngineInfo {
        &self.info
    }

    pub(crate) fn stats_handle(&self) -> Arc<Mutex<EngineStats>> {
        self.stats.clone()
    }

    pub(crate) fn run(mut self, rx: Receiver<Command>) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() && !self.loading.is_empty() {
                // Nothing else to do: wait for the loads here rather than spin.
                self.wait_loading();
            }
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
                    Command::GenerateBatch { requests } => requests
                        .into_iter()
                        .for_each(|(request, reply)| self.enqueue(request, reply, None)),
                    Command::GenerateStreaming {
                        request,
                        reply,
                        stream,
                    } => self.enqueue(request, reply, Some(stream)),
                    Command::Score {
                        tokens,
                        adapter,
                        reply,
                    } => {
                        self.settle();
                        reply.send(self.score(&tokens, adapter))
                    }
                    Command::PinKv {
                        id,
                        tokens,
                        adapter,
                    } => {
                        let ns = adapter.map_or(0, |h| self.adapters.ns_of(h.id));
                        self.kv.pin(id, ns, &tokens);
                    }
                    Command::UnpinKv { id } => self.kv.unpin(id),
                    Command::ResetPrefixCache { reply } => {
                        self.settle();
                        self.wait_loading();
                        let freed = self.kv.reset_prefix_cache();
                        tracing::info!(blocks = freed, "prefix cache reset");
                        self.publish_stats();
                        reply.send(Ok(freed))
                    }
                    Command::UpdateWeights {
                        source,
                        drain,
                        reply,
                    } => {
                        self.wait_loading();
                        self.ask_update(source, drain, reply)
                    }
                    Command::AddAdapter {
                        name,
                        adapter,
                        reply,
                    } => self.add_adapter(name, adapter, reply),
                    Command::RetireAdapter { id, drain, reply } => {
                        self.wait_loading();
                        self.retire_adapter(id, drain, reply)
                    }
                    Command::Shutdown => shutdown = true,
                }
            }
            if shutdown {
                self.wait_loading();
                break;
            }
            self.progress_update();
            self.drop_retired_adapters();
            // A step in flight is settled before an admission that can happen now (pipeline.rs;
            // `drop_abandoned` settles it itself before a running sequence goes); while no
            // waiting request can be admitted (no slot, or the KV memory that refused the last
            // admission has not grown), decode stays pipelined.
            if self.admission_possible() {
                self.settle();
            }
            self.drop_abandoned();
            self.poll_loading();
            if self.inflight.is_none() {
                self.admit();
            }
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

    pub(super) fn publish_stats(&self) {
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
        s.kv_tiers = kv.tiers;
        s.adapters = self.adapters.len();
        if s.weights_version != self.weights {
            s.weights_version = self.weights.clone();
        }
    }

    fn enqueue(
        &mut self,
        mut request: GenerationRequest,
        reply: Replier<Generation>,
        stream: Option<StreamSender>,
    ) {
        let ns = match self
            .info
            .check(&request)
            .and_then(|()| self.adapter_of_new(&mut request.adapter))
        {
            Ok(ns) => ns,
            Err(e) => {
                self.stats.lock().requests_failed += 1;
                reply.send(Err(e));
                return;
            }
        };
        let max_new = self.info.max_new_tokens(&request);
        let seed = request.sampling.seed;
        let request_grammar = request.grammar.as_ref().map(Grammar::matcher);
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
            tier_prompt_tokens: (0, 0),
            pin: None,
            swapped: None,
            detok: Detokenizer::default(),
            undecoded: Vec::new(),
            stop_checked: 0,
            preemptions: 0,
            stream: stream.map(|s| (s, 0)),
            logprobs: Vec::new(),
            ngram: None,
            draft: Vec::new(),
            draft_masks: Vec::new(),
            draft_kv: None,
            drafted_ahead: None,
            spec_misses: 0,
            spec_skip: 0,
            verified: Vec::new(),
            verified_logprobs: Vec::new(),
            grammar: request_grammar,
            slot: None,
            ns,
        });
    }
}
