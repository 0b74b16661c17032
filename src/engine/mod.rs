//! The engine: one per loaded model, shared through a cheap `Clone` handle.
//!
//! [`Engine::generate`] may be called from many threads at once (and [`Engine::submit`]
//! awaited from async hosts). A scheduler thread owns the model and the KV memory and runs
//! continuous batching: admit, chunked prefill, one batched decode step for every running
//! sequence, sample, stop, release. A request that fails, fails alone.
//!
//! Rooms, arrows pointing down this list only:
//! - this file (the handle), `options` ([`EngineOptions`], [`KernelOptions`]; `defaults`
//!   is the one table of defaults), `flags` and `kernel_flags` (the CLI face of the options), `request`
//!   (requests, generations, stats, [`EngineInfo`]), `handle` (reply slots and streams),
//!   `update` (weight sources and versions);
//! - `scheduler/`: plan a step -> runner -> update from the step's output;
//! - `runner/`: [`ModelRunner`](runner) load, KV sizing, graphs, sampler, the rank worker;
//! - `model/`: config, files, weights, loader, shard, paged KV, Qwen3, the kernel forward;
//! - `parallel/`: how ranks talk (in-process, NCCL); `batch`: the geometry of a varlen batch;
//! - `cuda/` (feature `cuda`): the kernels' launchers; `device`: device and dtype choice.

pub mod batch;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod defaults;
mod device;
mod flags;
mod handle;
mod kernel_flags;
mod kernel_options;
pub mod kv_format;
pub mod model;
mod options;
pub mod parallel;
mod request;
pub mod runner;
mod scheduler;
mod update;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;

use candle_core::Device;
use parking_lot::Mutex;
use tokenizers::Tokenizer;

pub use batch::{LogitRows, SeqInput};
pub use device::{DTypeChoice, DeviceChoice, KvBudget};
pub use flags::{EngineFlags, KernelFlags};
pub use handle::{CancelOnDrop, CancelToken, NextChunk, Pending, TokenStream};
pub use model::config::{GenerationConfig, ModelConfig};
pub use model::files::ModelFiles;
#[doc(hidden)]
pub use options::DraftReplay;
pub use options::{
    EngineOptions, KernelOptions, KvCacheDtype, KvDiskOptions, KvLoad, LoraOptions,
    SpeculativeMethod, SpeculativeOptions,
};
pub use parallel::comm::{
    CommBackend, CommHandle, InProcessComm, RankSettings, WorkerCommand, agree,
};
pub use request::{
    EngineInfo, EngineStats, FinishReason, Generation, GenerationRequest, MAX_LOGPROBS,
    SamplingParams, TokenLogprob,
};
pub use runner::buckets::graph_buckets;
pub use runner::worker::{
    FailHook, WorkerOptions, WorkerReport, run_worker, spawn_in_process_workers,
};
pub use update::{
    AdapterHandle, AdapterVersion, HostTensor, WeightSource, WeightsVersion, content_digest,
};

use crate::error::{Error, Result};
use crate::grammar::GrammarCompiler;
use scheduler::{Command, Scheduler};

struct Inner {
    tx: Mutex<mpsc::Sender<Command>>,
    stats: Arc<Mutex<EngineStats>>,
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    grammars: once_cell::sync::OnceCell<GrammarCompiler>,
    grammar_mask_parts: Option<usize>,
    grammar_bounded_strings: bool,
    info: EngineInfo,
    /// The model's config (adapters are checked against it).
    cfg: ModelConfig,
    device: Device,
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
        let device = device::select(options.device, options.kernels.event_tracking)?;
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
            kv_dtype = ?info.kv_dtype,
            kv_blocks = info.num_blocks,
            kv_tokens = info.num_blocks * info.block_size,
            block_size = info.block_size,
            max_running = info.max_running,
            max_running_why = %info.max_running_why,
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
                eos: eos_token_ids.to_vec(),
                grammars: once_cell::sync::OnceCell::new(),
                grammar_mask_parts: options.grammar_mask_parts,
                grammar_bounded_strings: options.grammar_bounded_strings,
                info,
                cfg: cfg.clone(),
                device,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// Facts about this engine.
    pub fn info(&self) -> &EngineInfo {
        &self.inner.info
    }

    /// The device the model runs on (rank 0's, with tensor parallelism).
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Checks a request without submitting it (see [`EngineInfo::check`]).
    pub fn check(&self, request: &GenerationRequest) -> Result<()> {
        self.inner.info.check(request)
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// The compiler of grammars over this engine's tokenizer ([`GenerationRequest::grammar`]),
    /// built on first use (it walks the vocabulary once, and once per mask part where
    /// [`EngineOptions::grammar_mask_parts`] asks for split masks: 1.3-1.9 s for Qwen3's on the
    /// H200 host); a complete grammar ends the output with the model's first end-of-sequence
    /// token.
    pub fn grammar_compiler(&self) -> Result<&GrammarCompiler> {
        self.inner.grammars.get_or_try_init(|| {
            let eos = *self.inner.eos.first().ok_or_else(|| {
                Error::Grammar(
                    "the model names no end-of-sequence token, so no grammar could end".into(),
                )
            })?;
            GrammarCompiler::with_options(
                &self.inner.tokenizer,
                self.inner.info.vocab_size,
                eos,
                crate::grammar::MaskOptions {
                    parts: self
                        .inner
                        .grammar_mask_parts
                        .unwrap_or_else(crate::grammar::default_mask_parts),
                    bounded_strings: self.inner.grammar_bounded_strings,
                },
            )
        })
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

    /// Submits `requests` as one batch: the scheduler queues them all before its next
    /// admission, so they start in the same step as far as `max_running`, the KV memory and
    /// the step's token budget allow (an offline batch of prompts, as vLLM's
    /// `LLM.generate(prompts)`), where separate [`Engine::submit`] calls may be split across
    /// steps by when each arrives. A bad request fails alone, on its own [`Pending`]; the
    /// pendings come back in the order of `requests`.
    pub fn submit_batch(
        &self,
        requests: impl IntoIterator<Item = GenerationRequest>,
    ) -> Vec<Pending<Generation>> {
        let (requests, pending): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .map(|request| {
                let (reply, pending) = handle::channel();
                ((request, reply), pending)
            })
            .unzip();
        let _ = self
            .inner
            .tx
            .lock()
            .send(Command::GenerateBatch { requests });
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
        self.logits_with(tokens, None)
    }

    /// [`Engine::logits`] through a LoRA adapter (`None`: the base weights).
    pub fn logits_with(
        &self,
        tokens: Vec<u32>,
        adapter: Option<&AdapterHandle>,
    ) -> Result<Vec<Vec<f32>>> {
        let (reply, pending) = handle::channel();
        let _ = self.inner.tx.lock().send(Command::Score {
            tokens,
            adapter: adapter.cloned(),
            reply,
        });
        pending.wait()
    }

    /// Reads the PEFT LoRA adapter in `dir` (`adapter_config.json` +
    /// `adapter_model.safetensors`), checks it against this engine's model and registers it
    /// under `name` (a second adapter under one name is its next version). Requests name it
    /// with [`GenerationRequest::adapter`]; it moves into a device slot when a request needs
    /// it. Fails on an engine without adapters ([`EngineOptions::lora`]) and on an adapter
    /// it could not serve exactly ([`Error::Adapter`] names the file and tensor).
    pub fn load_adapter(&self, name: &str, dir: &std::path::Path) -> Result<AdapterHandle> {
        let info = &self.inner.info;
        if info.max_loras == 0 {
            return Err(Error::InvalidInput(format!(
                "LoRA adapters are off on engine `{}`; start it with adapters enabled (EngineOptions::lora, --enable-lora)",
                info.key
            )));
        }
        let started = std::time::Instant::now();
        let adapter = model::lora::LoraAdapter::load(dir, &self.inner.cfg, info.max_lora_rank)?;
        // Laid out as the device slots hold it here, so that moving it in later is uploads only.
        let adapter = model::lora_slots::SlotImage::new(
            &adapter,
            &self.inner.cfg,
            info.max_lora_rank,
            info.dtype,
        )?;
        tracing::info!(adapter = name, dir = %dir.display(), ms = (started.elapsed().as_secs_f64() * 1e3).round(), "LoRA adapter read");
        let (reply, pending) = handle::channel();
        let _ = self.inner.tx.lock().send(Command::AddAdapter {
            name: name.to_string(),
            adapter: Arc::new(adapter),
            reply,
        });
        pending.wait()
    }

    /// Retires an adapter version: no new request starts on it (requests naming it move to
    /// the newest version of its name); requests running on it finish on it (`drain`) or end
    /// with [`FinishReason::Interrupted`] (`!drain`); it leaves the engine (host and device)
    /// once none uses it.
    pub fn retire_adapter(&self, adapter: &AdapterHandle, drain: bool) -> Pending<()> {
        let (reply, pending) = handle::channel();
        let _ = self.inner.tx.lock().send(Command::RetireAdapter {
            id: adapter.id,
            drain,
            reply,
        });
        pending
    }

    /// Pins the KV of `tokens` (a paused episode's transcript; under `adapter`'s weights when
    /// given) in the tiers below the GPU until the returned [`KvPin`] drops: its blocks may
    /// move down from GPU to host to disk, but the lowest tier drops them only when it has
    /// no room for anything else. Nothing happens when the tiers are off.
    pub fn pin_kv(&self, tokens: Vec<u32>, adapter: Option<&AdapterHandle>) -> KvPin {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tx = self.inner.tx.lock().clone();
        let _ = tx.send(Command::PinKv {
            id,
            tokens,
            adapter: adapter.cloned(),
        });
        KvPin { id, tx }
    }

    /// Drops every cached prefix that no running request uses (after new weights, say, when
    /// cached KV would be stale). Resolves to the number of KV blocks freed; `.await` it or
    /// [`Pending::wait`] for it.
    pub fn reset_prefix_cache(&self) -> Pending<usize> {
        let (reply, pending) = handle::channel();
        let _ = self
            .inner
            .tx
            .lock()
            .send(Command::ResetPrefixCache { reply });
        pending
    }

    /// Replaces the weights in place (see [`WeightSource`]): new requests wait while the
    /// update is pending; requests running on the old weights finish on them (`drain`) or
    /// end with [`FinishReason::Interrupted`] (`!drain`); then the new tensors are written
    /// into the model's buffers (no second copy stays behind), the prefix cache is dropped
    /// and the version goes up by one. Resolves to the new version. A refused update (a
    /// name, shape or dtype the model lacks, a missing tensor, a broken file) writes
    /// nothing: the old weights keep serving and the error says why.
    pub fn update_weights(&self, source: WeightSource, drain: bool) -> Pending<WeightsVersion> {
        let (reply, pending) = handle::channel();
        let _ = self.inner.tx.lock().send(Command::UpdateWeights {
            source,
            drain,
            reply,
        });
        pending
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        self.inner.stats.lock().clone()
    }
}

/// A pin on a transcript's KV in the tiers below the GPU ([`Engine::pin_kv`]); released when
/// dropped.
#[derive(Debug)]
pub struct KvPin {
    id: u64,
    tx: mpsc::Sender<Command>,
}

impl Drop for KvPin {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::UnpinKv { id: self.id });
    }
}

/// The device of `choice`, for callers that build models themselves (benchmarks, tests).
pub fn select_device(choice: DeviceChoice) -> Result<Device> {
    device::select(choice, KernelOptions::default().event_tracking)
}
