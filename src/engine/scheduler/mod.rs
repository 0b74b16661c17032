//! The scheduler thread: owns the model, the KV cache and the block pool; runs continuous
//! batching.
//!
//! Each loop: take new commands (block when idle), admit waiting requests while there are
//! free slots and blocks for their prompt, build one step (one decode token for every running
//! sequence first, then prefill chunks up to the token budget), run it, sample, stop, release.
//! When a growing sequence finds no free block, the running sequence with the fewest
//! generated tokens is preempted: its blocks are freed and it is requeued at the front, to be
//! recomputed from its tokens (same output). A step that fails is retried sequence by
//! sequence, so only the failing request fails.

mod memory;
mod tp;

use tp::HELLO_TIMEOUT;
pub(crate) use tp::{agree, rank_settings};

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use candle_core::{D, DType, Device, Tensor};
use parking_lot::Mutex;
use tokenizers::Tokenizer;

use super::comm::{CommBackend, WorkerCommand};
use super::config::ModelConfig;
use super::handle::{Replier, StreamSender};
use super::qwen3::{LogitRows, PagedKvCache, Qwen3, SeqInput, Shard};
use super::sampling::{Rng, sample};
use super::weights::Checkpoint;
use super::{EngineOptions, EngineStats, FinishReason, Generation, GenerationRequest};
use crate::cache::{BlockPool, RadixCache};
use crate::error::{Error, Result};

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

/// Where a step's wall time goes, summed over `every` steps, then printed to stderr.
#[derive(Debug, Default)]
struct StepProfile {
    every: u64,
    steps: u64,
    intake: Duration,
    step: Duration,
    launch: Duration,
    sync: Duration,
    post: Duration,
}

impl StepProfile {
    fn from_env() -> Option<Self> {
        let every: u64 = std::env::var("POLICY_SERVE_PROFILE_STEPS")
            .ok()?
            .parse()
            .ok()?;
        (every > 0).then(|| Self {
            every,
            ..Self::default()
        })
    }

    fn record(&mut self, intake: Duration, step: Duration, post: Duration, running: usize) {
        self.intake += intake;
        self.step += step;
        self.post += post;
        self.steps += 1;
        if self.steps == self.every {
            let ms = |d: Duration| d.as_secs_f64() * 1e3 / self.every as f64;
            eprintln!(
                "step profile (running {running}, ms/step over {} steps): intake {:.3} step {:.3} [forward launch {:.3}, argmax sync {:.3}] post {:.3}",
                self.every,
                ms(self.intake),
                ms(self.step),
                ms(self.launch),
                ms(self.sync),
                ms(self.post)
            );
            *self = Self {
                every: self.every,
                ..Self::default()
            };
        }
    }
}

pub(crate) struct Scheduler {
    model: Qwen3,
    cache: PagedKvCache,
    pool: BlockPool,
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    opts: EngineOptions,
    max_context: usize,
    vocab: usize,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    stats: Arc<Mutex<EngineStats>>,
    /// The prefix cache (None when disabled or unsafe for the architecture).
    radix: Option<RadixCache>,
    /// Host memory for swapped-out KV (0: preempt by recompute).
    swap_budget: usize,
    swap_used: usize,
    block_bytes: usize,
    cancelled: u64,
    /// Per-phase step timings (env `POLICY_SERVE_PROFILE_STEPS=N`: print every N steps).
    profile: Option<StepProfile>,
    /// The link to the tensor-parallel workers (None on one rank).
    comm: Option<Arc<dyn CommBackend>>,
    steps_sent: std::cell::Cell<u64>,
}

fn progress_bar(len: u64, msg: String) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} layers ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb.set_message(msg);
    pb
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
        let probe = Checkpoint::open(weights, DType::F32, device)?;
        let dtype = opts.dtype.resolve(device, probe.stored_dtype());
        drop(probe);
        let ck = Checkpoint::open(weights, dtype, device)?;
        let pb = progress_bar(cfg.num_hidden_layers as u64, format!("loading {key}"));
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
        if opts.speculative_tokens != 0 {
            return Err(Error::Unsupported(
                "speculative decoding is not implemented; set speculative_tokens to 0".into(),
            ));
        }
        let model =
            Qwen3::load(cfg, &ck, dtype, device, shard, || pb.inc(1)).map_err(|e| match e {
                e @ (Error::Checkpoint { .. } | Error::Unsupported(_)) => e,
                other => Error::Load {
                    key: key.into(),
                    reason: other.to_string(),
                },
            })?;
        pb.finish_and_clear();
        drop(ck);
        let block_bytes =
            cfg.kv_bytes_per_token(dtype.size_in_bytes()) * opts.block_size / shard.world;
        let max_useful = opts.max_running * cfg.max_position_embeddings.div_ceil(opts.block_size);
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
            let hello = WorkerCommand::Hello(rank_settings(cfg, opts, dtype, num_blocks));
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
        let stats = EngineStats {
            blocks_total: num_blocks,
            blocks_free: num_blocks,
            prefix_cache,
            ..Default::default()
        };
        Ok(Self {
            model,
            cache,
            pool: BlockPool::new(num_blocks),
            tokenizer,
            eos: eos.to_vec(),
            opts: opts.clone(),
            max_context: cfg.max_position_embeddings,
            vocab: cfg.vocab_size,
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: Arc::new(Mutex::new(stats)),
            radix: prefix_cache.then(|| RadixCache::new(opts.block_size)),
            swap_budget: if swap {
                (opts.swap_gib * (1u64 << 30) as f64) as usize
            } else {
                0
            },
            swap_used: 0,
            block_bytes,
            cancelled: 0,
            profile: StepProfile::from_env(),
            comm,
            steps_sent: std::cell::Cell::new(0),
        })
    }

    pub(crate) fn dtype(&self) -> DType {
        self.model.dtype()
    }

    pub(crate) fn num_blocks(&self) -> usize {
        self.pool.capacity()
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
                    Command::Score { tokens, reply } => reply.send(self.score(&tokens)),
                    Command::Shutdown => shutdown = true,
                }
            }
            if shutdown {
                break;
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
        if let Some(c) = &self.comm {
            // Head shutdown stops every worker.
            if let Err(e) = c.send_command(&WorkerCommand::Shutdown, Duration::from_secs(10)) {
                tracing::warn!(error = %e, "could not tell every worker to shut down");
            }
        }
        tracing::debug!("scheduler stopped");
    }

    fn publish_stats(&self) {
        let mut s = self.stats.lock();
        s.running = self.running.len();
        s.waiting = self.waiting.len();
        s.blocks_free = self.pool.num_free();
        s.requests_cancelled = self.cancelled;
        if let Some(r) = &self.radix {
            let c = r.stats();
            s.cache_lookups = c.lookups;
            s.cache_lookup_tokens = c.lookup_tokens;
            s.cache_hit_tokens = c.hit_tokens;
            s.cache_hit_rate = c.hit_rate();
            s.evicted_blocks = c.evicted_blocks;
            s.cached_blocks = c.cached_blocks;
        }
        s.swap_used_bytes = self.swap_used;
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
        if let Err(e) = self.check_request(&request, max_new) {
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
            stream: stream.map(|s| (s, 0)),
        });
    }

    fn check_request(&self, r: &GenerationRequest, max_new: usize) -> Result<()> {
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
        let cap = self.pool.capacity() * self.opts.block_size;
        if need > cap {
            return Err(Error::TooLarge(format!(
                "prompt ({} tokens) + max_new_tokens ({max_new}) = {need} tokens can never fit the KV pool of {} blocks x {} = {cap} tokens; raise the KV budget or lower max_new_tokens",
                r.prompt.len(),
                self.pool.capacity(),
                self.opts.block_size
            )));
        }
        Ok(())
    }

    /// Every token id must index the embedding.
    fn check_vocab(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|&&t| t as usize >= self.vocab) {
            Some(bad) => Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary (size {})",
                self.vocab
            ))),
            None => Ok(()),
        }
    }

    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.opts.block_size)
    }

    /// Builds and runs one step over the running sequences.
    fn step(&mut self) {
        // Order: decode sequences first (batched attention), then prefill chunks.
        self.running
            .sort_by_key(|s| s.tokens.len() - s.computed != 1);
        let mut budget = self.opts.max_batched_tokens;
        let mut plan: Vec<(usize, usize)> = Vec::new(); // (index into running, q_len)
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let s = &self.running[i];
            let todo = s.tokens.len() - s.computed;
            let q = todo.min(budget).min(if todo == 1 {
                1
            } else {
                self.opts.prefill_chunk
            });
            let target = self.running[i].computed + q;
            let before = self.running.len();
            if !self.grow(i, target) {
                // `i` itself was preempted; indices after it shifted down by one.
                continue;
            }
            if self.running.len() < before {
                // Someone else was preempted; restart planning (indices shifted).
                plan.clear();
                budget = self.opts.max_batched_tokens;
                i = 0;
                continue;
            }
            plan.push((i, q));
            budget -= q;
            i += 1;
        }
        if plan.is_empty() {
            return;
        }
        match self.run_plan(&plan) {
            Ok(next) => self.apply(&plan, next),
            Err(e) if plan.len() > 1 => {
                tracing::warn!(error = %e, "batched step failed; retrying sequence by sequence");
                let mut outcomes = Vec::with_capacity(plan.len());
                for &p in &plan {
                    outcomes.push((p, self.run_plan(&[p])));
                }
                let mut failed = Vec::new();
                for ((idx, q), res) in outcomes {
                    match res {
                        Ok(next) => self.apply(&[(idx, q)], next),
                        Err(e) => failed.push((idx, e)),
                    }
                }
                self.fail(failed);
            }
            Err(e) => self.fail(vec![(plan[0].0, e)]),
        }
        self.finish_done();
    }

    /// Runs the forward for `plan`; returns the sampled next token per planned sequence
    /// (None for prefill chunks that do not end the prompt).
    fn run_plan(&mut self, plan: &[(usize, usize)]) -> Result<Vec<Option<u32>>> {
        let mut tokens = Vec::new();
        let mut inputs = Vec::with_capacity(plan.len());
        for &(i, q) in plan {
            let s = &self.running[i];
            tokens.extend_from_slice(&s.tokens[s.computed..s.computed + q]);
            let ends = s.computed + q == s.tokens.len();
            inputs.push(SeqInput {
                q_len: q,
                context_len: s.computed + q,
                block_table: &s.blocks,
                logits: if ends {
                    LogitRows::Last
                } else {
                    LogitRows::None
                },
            });
        }
        let wants: Vec<bool> = inputs.iter().map(|s| s.logits == LogitRows::Last).collect();
        let t_launch = Instant::now();
        let logits = self.forward(&tokens, &inputs)?;
        drop(inputs);
        let t_sync = Instant::now();
        let mut out = vec![None; plan.len()];
        let Some(logits) = logits else { return Ok(out) };
        let all_greedy = plan
            .iter()
            .zip(&wants)
            .filter(|(_, w)| **w)
            .all(|((i, _), _)| self.running[*i].request.sampling.is_greedy());
        let greedy: Vec<u32> = logits.argmax(D::Minus1)?.to_vec1()?;
        if let Some(p) = &mut self.profile {
            p.launch += t_sync - t_launch;
            p.sync += t_sync.elapsed();
        }
        let mut row = 0;
        for (k, &(i, _)) in plan.iter().enumerate() {
            if !wants[k] {
                continue;
            }
            let s = &mut self.running[i];
            out[k] = Some(if all_greedy || s.request.sampling.is_greedy() {
                greedy[row]
            } else {
                let l: Vec<f32> = logits.get(row)?.to_vec1()?;
                sample(&l, &s.request.sampling, &mut s.rng)
            });
            row += 1;
        }
        Ok(out)
    }

    fn apply(&mut self, plan: &[(usize, usize)], next: Vec<Option<u32>>) {
        let now = Instant::now();
        let mut stats = self.stats.lock();
        stats.steps += 1;
        for (&(i, q), tok) in plan.iter().zip(next) {
            let s = &mut self.running[i];
            let in_prompt = s.computed < s.prompt_len();
            if in_prompt {
                stats.prefill_tokens += q.min(s.prompt_len() - s.computed) as u64;
            }
            s.computed += q;
            if let Some(t) = tok {
                s.tokens.push(t);
                s.first_token.get_or_insert(now);
                stats.generated_tokens += 1;
            }
            // Publish a finished prompt to the prefix cache at once, so that requests sharing
            // it (other episodes of the task) reuse it while this one is still decoding.
            if in_prompt
                && s.computed >= s.prompt_len()
                && let Some(r) = &mut self.radix
                && let Err(e) = r.insert(&s.tokens[..s.prompt_len()], &s.blocks, &mut self.pool)
            {
                tracing::error!(error = %e, "block accounting error while caching a prompt");
            }
        }
    }

    fn fail(&mut self, mut failed: Vec<(usize, Error)>) {
        failed.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, e) in failed {
            let mut s = self.running.remove(i);
            tracing::warn!(error = %e, "request failed; the others go on");
            // Its KV may be half-written: drop it without caching.
            if let (Some(r), Some(node)) = (&mut self.radix, s.pin.take()) {
                r.release(node);
            }
            if let Err(e) = self.pool.release(&s.blocks) {
                tracing::error!(error = %e, "block accounting error");
            }
            self.stats.lock().requests_failed += 1;
            self.publish_stats();
            s.reply.send(Err(Error::Engine(e.to_string())));
        }
    }

    /// Finishes sequences that hit EOS, a stop string or their cap.
    fn finish_done(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            let generated = s.generated();
            let fresh = s.computed + 1 == s.tokens.len() && generated > 0;
            let mut reason = None;
            if fresh {
                let last = *s.tokens.last().expect("generated a token");
                if !s.request.ignore_eos && self.eos.contains(&last) {
                    reason = Some(FinishReason::Eos);
                } else if !s.request.stop.is_empty() && self.hits_stop(s) {
                    reason = Some(FinishReason::Stop);
                } else if generated >= s.max_new {
                    reason = Some(FinishReason::Length);
                }
            }
            if fresh && reason.is_none() && self.running[i].stream.is_some() {
                self.stream_delta(i);
            }
            match reason {
                Some(r) => {
                    let s = self.running.remove(i);
                    self.finish(s, r);
                }
                None => i += 1,
            }
        }
    }

    /// Sends the text generated since the last chunk, holding back what could still become a
    /// stop string and an incomplete UTF-8 character.
    fn stream_delta(&mut self, i: usize) {
        let text = self.generated_text(&self.running[i]);
        let s = &mut self.running[i];
        let hold = s
            .request
            .stop
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        let mut safe = text.len().saturating_sub(hold);
        if text.ends_with('\u{FFFD}') {
            safe = safe.min(text.len() - '\u{FFFD}'.len_utf8());
        }
        while !text.is_char_boundary(safe) {
            safe -= 1;
        }
        if let Some((sender, sent)) = &mut s.stream
            && safe > *sent
        {
            sender.send(&text[*sent..safe]);
            *sent = safe;
        }
    }

    fn generated_text(&self, s: &Seq) -> String {
        let mut gen_tokens = &s.tokens[s.prompt_len()..];
        if let Some((last, head)) = gen_tokens.split_last()
            && self.eos.contains(last)
        {
            gen_tokens = head;
        }
        self.tokenizer.decode(gen_tokens, false).unwrap_or_default()
    }

    fn hits_stop(&self, s: &Seq) -> bool {
        let text = self.generated_text(s);
        s.request
            .stop
            .iter()
            .any(|st| !st.is_empty() && text.contains(st.as_str()))
    }

    fn finish(&mut self, mut s: Seq, reason: FinishReason) {
        self.release_seq(&mut s);
        let mut text = self.generated_text(&s);
        if reason == FinishReason::Stop
            && let Some(cut) = s
                .request
                .stop
                .iter()
                .filter(|st| !st.is_empty())
                .filter_map(|st| text.find(st.as_str()))
                .min()
        {
            text.truncate(cut);
        }
        if let Some((sender, sent)) = s.stream.take()
            && text.len() > sent
            && text.is_char_boundary(sent)
        {
            sender.send(&text[sent..]);
        }
        let now = Instant::now();
        let generated = s.generated();
        let g = Generation {
            tokens: s.tokens[s.prompt_len()..].to_vec(),
            text,
            finish_reason: reason,
            prompt_tokens: s.prompt_len(),
            cached_prompt_tokens: s.cached_prompt_tokens,
            generated_tokens: generated,
            queue_time: s.admitted.map(|a| a - s.submitted).unwrap_or_default(),
            time_to_first_token: s.first_token.map(|f| f - s.submitted).unwrap_or_default(),
            total_time: now - s.submitted,
        };
        self.stats.lock().requests_finished += 1;
        self.publish_stats();
        s.reply.send(Ok(g));
    }

    /// Logits of every position of `tokens`, computed in prefill chunks on temporary blocks.
    fn score(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        if tokens.is_empty() {
            return Err(Error::InvalidInput("no tokens to score".into()));
        }
        self.check_vocab(tokens)?;
        if tokens.len() > self.max_context {
            return Err(Error::TooLarge(format!(
                "{} tokens exceed the model's context of {}",
                tokens.len(),
                self.max_context
            )));
        }
        let need = self.blocks_for(tokens.len());
        let blocks = self.pool.allocate(need).ok_or_else(|| {
            Error::TooLarge(format!(
                "{} tokens need {need} KV blocks; {} are free now",
                tokens.len(),
                self.pool.num_free()
            ))
        })?;
        let mut rows = Vec::with_capacity(tokens.len());
        let mut done = 0;
        let res: Result<()> = (|| {
            while done < tokens.len() {
                let q = (tokens.len() - done).min(self.opts.prefill_chunk);
                let input = [SeqInput {
                    q_len: q,
                    context_len: done + q,
                    block_table: &blocks,
                    logits: LogitRows::All,
                }];
                let l = self
                    .forward(&tokens[done..done + q], &input)?
                    .expect("asked for logits");
                rows.extend(l.to_vec2::<f32>()?);
                done += q;
            }
            Ok(())
        })();
        self.pool.release(&blocks)?;
        res.map(|_| rows)
    }
}
