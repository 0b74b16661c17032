//! What a host hands the engine and gets back: [`GenerationRequest`] (with its
//! [`SamplingParams`]), [`Generation`], [`FinishReason`], the engine's counters
//! ([`EngineStats`]) and facts ([`EngineInfo`], which checks a request before it is submitted).

use std::time::Duration;

use candle_core::DType;
use serde::{Deserialize, Serialize};

use super::model::config::GenerationConfig;
use super::update::WeightsVersion;
use crate::error::{Error, Result};

/// How to pick the next token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 (or below) means greedy.
    pub temperature: f32,
    /// Keep only the k most likely tokens (`None`/0: all).
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p (`None`/1.0: all).
    pub top_p: Option<f32>,
    /// Keep only tokens at least this fraction as likely as the most likely one (vLLM's
    /// min-p, applied after the temperature, before top-p; `None`/0: off). Rows with min-p
    /// are drawn on the host.
    #[serde(default)]
    pub min_p: Option<f32>,
    /// RNG seed.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    /// Always the most likely token.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            seed: 0,
        }
    }

    /// The sampling of one request: the request's own `temperature`/`top_p` where given, else
    /// the model's `generation_config.json` defaults (greedy when it does not sample; HF's
    /// temperature 1.0 when it samples and names none). The one place where defaults are
    /// decided, for the HTTP host and the model policy alike.
    pub fn resolve(
        defaults: &GenerationConfig,
        temperature: Option<f32>,
        top_p: Option<f32>,
        seed: u64,
    ) -> Self {
        let default_temperature = if defaults.do_sample {
            defaults.temperature.unwrap_or(1.0)
        } else {
            0.0
        };
        Self {
            temperature: temperature.unwrap_or(default_temperature),
            top_k: defaults.top_k,
            top_p: top_p.or(defaults.top_p),
            min_p: None,
            seed,
        }
    }

    /// Whether top-k, top-p or min-p may cut the vocabulary a sampled row draws from (what
    /// decides a whole-vocabulary draw on the device and log-probs of the cut distribution).
    pub fn cuts_vocabulary(&self) -> bool {
        self.top_k.is_some_and(|k| k > 0)
            || self.top_p.is_some_and(|p| p < 1.0)
            || self.min_p_cut().is_some()
    }

    /// min-p when it cuts anything (in (0, 1]).
    pub fn min_p_cut(&self) -> Option<f32> {
        self.min_p.filter(|p| *p > 0.0 && *p <= 1.0)
    }

    /// Whether this is greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == Some(1)
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
    /// Log-probabilities of each generated token and of the `k` most likely alternatives at
    /// its position (`Some(0)`: the generated token's only; at most [`MAX_LOGPROBS`]), in
    /// the distribution the token was drawn from: the logits over the temperature (1 for
    /// greedy rows), renormalized over the tokens top-k / top-p keep. `None`: none.
    pub logprobs: Option<usize>,
    /// vLLM's repetition penalty: before anything else, the logit of every token that occurs
    /// in the prompt or the output so far is divided by it when positive and multiplied by it
    /// otherwise (`None` or 1: off; must be above 0). It shapes greedy rows too, and the
    /// log-probabilities are those of the penalized distribution. Steps with it are not
    /// pipelined.
    pub repetition_penalty: Option<f32>,
    /// What the output may be: a grammar compiled by the engine's
    /// [`Engine::grammar_compiler`](crate::Engine::grammar_compiler) (for tool calls and JSON
    /// answers, `OutputConstraint::compile` in `policy::format`). Each step masks the
    /// logits to the tokens the grammar allows, on the device, before any draw; greedy rows,
    /// draws and log-probs all see the mask. The grammar decides where the output ends (it
    /// allows EOS only once complete), so `min_tokens` must be 0. Steps with a constrained
    /// row are not pipelined and such rows take no speculative drafts. `None`: unconstrained.
    pub grammar: Option<crate::grammar::Grammar>,
    /// The LoRA adapter the request runs through (loaded with
    /// [`Engine::load_adapter`](crate::Engine::load_adapter); `None`: the base weights).
    /// Requests on different adapters and on the base share steps.
    pub adapter: Option<super::update::AdapterHandle>,
    /// Benchmarks only: with speculative decoding on, drafts are read from this known
    /// continuation (some tokens corrupted) instead of the n-gram index, so that a bench
    /// can measure speed at a chosen acceptance (`examples/bench`'s `--spec-ks`).
    #[doc(hidden)]
    pub draft_replay: Option<std::sync::Arc<super::options::DraftReplay>>,
}

/// Most alternatives [`GenerationRequest::logprobs`] may ask for (OpenAI's and vLLM's 20).
pub const MAX_LOGPROBS: usize = 20;

/// The log-probability of one generated token and of the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    /// The generated token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens there and their log-probabilities, most likely first (as many
    /// as the request asked for).
    pub top: Vec<(u32, f32)>,
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
            logprobs: None,
            repetition_penalty: None,
            grammar: None,
            adapter: None,
            draft_replay: None,
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
    /// Ended early by a weight update that did not wait for it (`drain: false`); the tokens
    /// so far are the old weights'.
    Interrupted,
}

impl FinishReason {
    /// The OpenAI `finish_reason`: `stop` (EOS or a stop string), `length`, or `abort` (vLLM's
    /// word for a request ended by the server).
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Eos | FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Interrupted => "abort",
        }
    }
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
    /// Prompt tokens whose KV came from the prefix cache (any tier).
    pub cached_prompt_tokens: usize,
    /// Of `cached_prompt_tokens`, those loaded back from the host KV tier.
    pub cached_prompt_tokens_host: usize,
    /// Of `cached_prompt_tokens`, those loaded back from the disk KV tier.
    pub cached_prompt_tokens_disk: usize,
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
    /// Per generated token, its log-probability and the alternatives', when the request
    /// asked ([`GenerationRequest::logprobs`]).
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// The weights that produced every token of it.
    pub weights_version: WeightsVersion,
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
    /// The weights serving now.
    pub weights_version: WeightsVersion,
    /// Speculative decoding: draft tokens verified.
    pub spec_draft_tokens: u64,
    /// Speculative decoding: drafts the model confirmed (each a token gained over plain
    /// decoding).
    pub spec_accepted_tokens: u64,
    /// Speculative decoding: sequence-steps that verified drafts. Each gives its accepted
    /// drafts plus the model's own token: `(spec_accepted_tokens + spec_verify_steps) /
    /// spec_verify_steps` tokens a verify ([`EngineStats::spec_mean_accepted_length`]).
    pub spec_verify_steps: u64,
    /// Speculative decoding: decode steps run without drafts because more sequences ran
    /// than `SpeculativeOptions::max_batch` allows.
    pub spec_paused_steps: u64,
    /// Speculative decoding with a draft model: its forwards (each drafts one token for
    /// every sequence drafting that step, or catches one up on a long stretch of tokens).
    pub spec_draft_forwards: u64,
    /// LoRA adapters moved into a device slot (a first use, or back after the slot went to
    /// another adapter).
    pub adapter_loads: u64,
    /// LoRA adapter versions registered (host copies; a replaced version leaves once no
    /// request uses it).
    pub adapters: usize,
    /// The KV tiers below the GPU (host, disk): blocks, bytes, loads, checksum failures
    /// (`None`: off).
    pub kv_tiers: Option<crate::cache::TierStats>,
}

impl EngineStats {
    /// Speculative decoding: the mean number of tokens a sequence-step with drafts gave (its
    /// accepted drafts and the model's own token; 1: no draft kept); `None` before any.
    pub fn spec_mean_accepted_length(&self) -> Option<f64> {
        (self.spec_verify_steps > 0).then(|| {
            (self.spec_accepted_tokens + self.spec_verify_steps) as f64
                / self.spec_verify_steps as f64
        })
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
    /// The KV cache's storage dtype (`EngineOptions::kv_dtype`: the compute dtype, or
    /// `F8E4M3` with per-layer scales).
    pub kv_dtype: DType,
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
    /// Most sequences decoding at once (`EngineOptions::max_running`, or derived).
    pub max_running: usize,
    /// Why `max_running` is what it is: given, or how the engine derived it.
    pub max_running_why: String,
    /// Ranks the model spans (1: no tensor parallelism).
    pub world_size: usize,
    /// LoRA adapter slots on the device (0: adapters are off).
    pub max_loras: usize,
    /// The largest LoRA rank served (0: adapters are off).
    pub max_lora_rank: usize,
}

impl EngineInfo {
    /// Checks a request against this engine (prompt not empty, token ids in the vocabulary,
    /// prompt + max new tokens within the context and the KV pool) without submitting it, so
    /// a host can refuse it before answering (e.g. before an SSE response starts). The engine
    /// runs the same check on submission.
    pub fn check(&self, r: &GenerationRequest) -> Result<()> {
        if r.prompt.is_empty() {
            return Err(Error::InvalidInput("the prompt is empty".into()));
        }
        self.check_vocab(&r.prompt)?;
        let room = self.room();
        if r.max_new_tokens.is_none() && r.prompt.len() >= room {
            return Err(Error::TooLarge(format!(
                "the prompt ({} tokens) leaves no room to generate in the {room} tokens this engine serves per sequence; shorten the prompt",
                r.prompt.len()
            )));
        }
        let max_new = self.max_new_tokens(r);
        if let Some(k) = r.logprobs
            && k > MAX_LOGPROBS
        {
            return Err(Error::InvalidInput(format!(
                "logprobs asks for {k} alternatives a token; at most {MAX_LOGPROBS}"
            )));
        }
        if let Some(p) = r.repetition_penalty
            && !(p.is_finite() && p > 0.0)
        {
            return Err(Error::InvalidInput(format!(
                "repetition_penalty must be a finite number above 0, got {p}"
            )));
        }
        if let Some(g) = &r.grammar
            && g.vocab_size() != self.vocab_size
        {
            return Err(Error::InvalidInput(format!(
                "the grammar was compiled for a vocabulary of {} tokens; this engine's model has {} (compile it with this engine's grammar_compiler)",
                g.vocab_size(),
                self.vocab_size
            )));
        }
        if r.grammar.is_some() && r.min_tokens > 0 {
            return Err(Error::InvalidInput(format!(
                "min_tokens ({}) cannot be combined with a grammar: the grammar decides where the output ends",
                r.min_tokens
            )));
        }
        if r.min_tokens > max_new {
            return Err(Error::InvalidInput(format!(
                "min_tokens ({}) is over max_new_tokens ({max_new})",
                r.min_tokens
            )));
        }
        if max_new == 0 {
            return Err(Error::InvalidInput(
                "max_new_tokens must be at least 1".into(),
            ));
        }
        // Checked: a cap near usize::MAX must be refused, not wrap into a small sum.
        let need = r.prompt.len().checked_add(max_new);
        let shown = need.map_or_else(|| "more than usize::MAX".to_string(), |n| n.to_string());
        if need.is_none_or(|n| n > self.max_context) {
            return Err(Error::TooLarge(format!(
                "prompt ({} tokens) + max_new_tokens ({max_new}) = {shown} exceeds the model's context of {} tokens; shorten the prompt or lower max_new_tokens",
                r.prompt.len(),
                self.max_context
            )));
        }
        let cap = self.num_blocks.saturating_mul(self.block_size);
        if need.is_none_or(|n| n > cap) {
            return Err(Error::TooLarge(format!(
                "prompt ({} tokens) + max_new_tokens ({max_new}) = {shown} tokens can never fit the KV pool of {} blocks x {} = {cap} tokens; raise the KV budget or lower max_new_tokens",
                r.prompt.len(),
                self.num_blocks,
                self.block_size
            )));
        }
        Ok(())
    }

    /// The most tokens one sequence (prompt + generated) can hold: the context, or the KV
    /// pool where it is smaller.
    pub fn room(&self) -> usize {
        self.max_context
            .min(self.num_blocks.saturating_mul(self.block_size))
    }

    /// The cap on generated tokens of `r`: its own, or (when it names none) the engine's
    /// default lowered to the room its prompt leaves, as OpenAI and vLLM do.
    pub fn max_new_tokens(&self, r: &GenerationRequest) -> usize {
        r.max_new_tokens.unwrap_or_else(|| {
            self.default_max_new_tokens
                .min(self.room().saturating_sub(r.prompt.len()))
        })
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
