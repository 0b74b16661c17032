//! The scheduler's data: the [`Command`]s the engine handle sends, each request as a [`Seq`],
//! a step's plan ([`StepPlan`] of [`Planned`] sequences) and a step launched but not read
//! ([`InFlight`], pipelined decode). Plain data; the behaviour is in the files beside it.

use std::time::Instant;

use candle_core::Tensor;

use super::detok::Detokenizer;
use super::ngram::NgramIndex;
use crate::engine::handle::{Replier, StreamSender};
use crate::engine::model::weights::Checkpoint;
use crate::engine::request::{Generation, GenerationRequest, TokenLogprob};
use crate::engine::runner::logprobs::{LogprobRow, Pending as PendingLogprobs};
use crate::engine::runner::sampler::Rng;
use crate::engine::runner::{GpuEvent, HostIds};
use crate::engine::update::{HostTensor, WeightSource, WeightsVersion};
use crate::grammar::GrammarMatcher;

/// What the engine handle sends the scheduler thread.
pub(crate) enum Command {
    Generate {
        request: GenerationRequest,
        reply: Replier<Generation>,
    },
    /// Requests submitted together (`Engine::submit_batch`): queued in one scheduler pass.
    GenerateBatch {
        requests: Vec<(GenerationRequest, Replier<Generation>)>,
    },
    GenerateStreaming {
        request: GenerationRequest,
        reply: Replier<Generation>,
        stream: StreamSender,
    },
    Score {
        tokens: Vec<u32>,
        adapter: Option<crate::engine::update::AdapterHandle>,
        reply: Replier<Vec<Vec<f32>>>,
    },
    ResetPrefixCache {
        reply: Replier<usize>,
    },
    UpdateWeights {
        source: WeightSource,
        drain: bool,
        reply: Replier<WeightsVersion>,
    },
    AddAdapter {
        name: String,
        adapter: std::sync::Arc<crate::engine::model::lora_slots::SlotImage>,
        reply: Replier<crate::engine::update::AdapterHandle>,
    },
    RetireAdapter {
        id: u64,
        drain: bool,
        reply: Replier<()>,
    },
    PinKv {
        id: u64,
        tokens: Vec<u32>,
        adapter: Option<crate::engine::update::AdapterHandle>,
    },
    UnpinKv {
        id: u64,
    },
    Shutdown,
}

/// One request as the scheduler carries it from waiting to finished.
pub(super) struct Seq {
    pub(super) request: GenerationRequest,
    pub(super) reply: Replier<Generation>,
    /// Prompt followed by the generated tokens.
    pub(super) tokens: Vec<u32>,
    /// Tokens whose KV is in the cache.
    pub(super) computed: usize,
    pub(super) blocks: Vec<u32>,
    pub(super) max_new: usize,
    pub(super) rng: Rng,
    pub(super) submitted: Instant,
    pub(super) admitted: Option<Instant>,
    pub(super) first_token: Option<Instant>,
    pub(super) cached_prompt_tokens: usize,
    /// Of `cached_prompt_tokens`, loaded back from host and from disk.
    pub(super) tier_prompt_tokens: (usize, usize),
    /// The radix node pinned for this sequence's cached prefix.
    pub(super) pin: Option<usize>,
    /// KV of the computed tokens, swapped out to host memory (per layer K, V).
    pub(super) swapped: Option<Vec<(Tensor, Tensor)>>,
    /// The generated text so far, decoded incrementally.
    pub(super) detok: Detokenizer,
    /// Generated tokens not decoded yet (decoded while the GPU runs the next step).
    pub(super) undecoded: Vec<u32>,
    /// Bytes of the text already searched for stop strings.
    pub(super) stop_checked: usize,
    /// Times preempted.
    pub(super) preemptions: u32,
    /// Where the text goes as it is generated, and how many bytes of it went.
    pub(super) stream: Option<(StreamSender, usize)>,
    /// The log-probabilities of the generated tokens so far (requests that ask for them).
    pub(super) logprobs: Vec<TokenLogprob>,
    /// Speculative decoding: the index of this sequence's n-grams (built on first use).
    pub(super) ngram: Option<NgramIndex>,
    /// Speculative decoding: the drafts of the step being planned or run.
    pub(super) draft: Vec<u32>,
    /// A constrained sequence's drafts are the tokens its grammar forces: the mask of each
    /// position the step draws at (`draft.len() + 1` of them), made with the drafts.
    pub(super) draft_masks: Vec<Vec<u32>>,
    /// Speculative decoding with a draft model: this sequence's KV in its cache.
    pub(super) draft_kv: Option<crate::engine::runner::draft::DraftKv>,
    /// Drafts the draft model made for this step in one batch with the other sequences'
    /// (`Scheduler::draft_ahead`), for `Scheduler::draft` to take.
    pub(super) drafted_ahead: Option<Vec<u32>>,
    /// Speculative decoding's backoff (`SpeculativeOptions::backoff`): verify steps in a row
    /// that kept no draft, and the steps left to decode without drafts.
    pub(super) spec_misses: u32,
    pub(super) spec_skip: u32,
    /// Speculative decoding: the tokens a step with drafts verified (kept drafts and the
    /// model's next token), waiting for `apply`.
    pub(super) verified: Vec<u32>,
    /// Speculative decoding: the log-prob of each position of a step with drafts (requests
    /// that ask), taken with the tokens `verified` keeps.
    pub(super) verified_logprobs: Vec<TokenLogprob>,
    /// A constrained request's place in its grammar (it is handed every generated token but
    /// EOS, and takes them when it computes the next mask).
    pub(super) grammar: Option<GrammarMatcher>,
    /// The device slot of its LoRA adapter while it runs (`None`: the base, or not running).
    pub(super) slot: Option<u32>,
    /// Its prefix-cache namespace (its adapter's content; 0: the base).
    pub(super) ns: u64,
}

impl Seq {
    pub(super) fn prompt_len(&self) -> usize {
        self.request.prompt.len()
    }

    /// Its prompt's cached tokens and those of them a tier below the GPU gave, from the
    /// `cached` tokens its blocks hold (`host` and `disk` of them loaded from those tiers,
    /// after the GPU's): loaded blocks follow the GPU's, so what a tier gave past the prompt
    /// is not the prompt's.
    pub(super) fn count_prompt_cache(&mut self, cached: usize, host: usize, disk: usize) {
        let prompt = self.prompt_len();
        self.cached_prompt_tokens = cached.min(prompt);
        let gpu = cached - (host + disk).min(cached);
        let below = prompt.saturating_sub(gpu);
        let host = host.min(below);
        self.tier_prompt_tokens = (host, disk.min(below - host));
    }
    pub(super) fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len()
    }
}

/// One planned sequence: its index in `running` and its new tokens this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Planned {
    pub(super) index: usize,
    pub(super) q_len: usize,
}

/// What one step runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct StepPlan {
    pub(super) seqs: Vec<Planned>,
}

/// A step launched whose tokens the host has not read.
pub(super) struct InFlight {
    /// The step's sequences (indices into `running`, each one decode token).
    pub(super) plan: Vec<Planned>,
    /// The token drawn for each, on the device (u32 `[plan.len()]`): the next step's input.
    pub(super) ids: Tensor,
    /// The same ids on their way to the host (queued before the next step's launches).
    pub(super) host: HostIds,
    /// Events around the step's GPU work (the step profile).
    pub(super) gpu: (Option<GpuEvent>, Option<GpuEvent>),
    /// The log-probs its rows asked for (row = index into `plan`), on their way to the host.
    pub(super) logprobs: Option<(Vec<LogprobRow>, PendingLogprobs)>,
}

/// New weights, checked (every name, shape, dtype and byte count) and not written yet.
pub(crate) enum CheckedWeights {
    /// A checkpoint on disk (its directory, for the other ranks), the table of tensors to
    /// write, in order.
    Dir(
        std::path::PathBuf,
        Box<Checkpoint>,
        Vec<(String, Vec<usize>)>,
    ),
    /// Tensors in host memory.
    Host(Vec<HostTensor>),
}

/// An update asked for, checked, and not applied yet.
pub(crate) struct PendingUpdate {
    pub(crate) weights: CheckedWeights,
    pub(crate) drain: bool,
    pub(crate) reply: Replier<WeightsVersion>,
    pub(crate) asked: Instant,
}

/// Where an admitted sequence's prefix is on its way back to the device.
pub(super) enum Loading {
    /// Being read from disk (the bool: the sequence's first admission, whose prompt counts
    /// are its own).
    Read(crate::cache::PendingRead, bool),
    /// Being copied to the device.
    Copy(crate::cache::LoadTicket),
}

impl Loading {
    pub(super) fn done(&self) -> bool {
        match self {
            Loading::Read(r, _) => r.done(),
            Loading::Copy(t) => t.0.done(),
        }
    }

    pub(super) fn wait(&self) {
        match self {
            Loading::Read(r, _) => r.wait(),
            Loading::Copy(t) => t.0.wait(),
        }
    }
}
