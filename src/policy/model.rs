//! `ModelPolicy`: a per-episode policy over a loaded model. Renders the transcript through the
//! model's own chat template, generates on the shared engine, parses the output into an action.

use std::sync::Arc;
use std::time::Instant;

use super::episode::{
    Action, EpisodeConfig, Observation, Policy, Step, StepCost, TranscriptMode, assistant_message,
    push_observation,
};
use super::format::{ChatTemplate, Message, RenderOptions, parse_output};
use crate::engine::{CancelToken, Engine, GenerationConfig, GenerationRequest, SamplingParams};
use crate::error::Result;

/// What a [`ModelPolicy`] needs of a loaded model: its engine, its own chat template, its
/// sampling defaults and how it was trained to think. Cheap to clone; the registry builds one
/// per loaded model (`From<Arc<LoadedModel>>`).
#[derive(Debug, Clone)]
pub struct PolicyModel {
    /// The model's key.
    pub key: String,
    /// The shared engine.
    pub engine: Engine,
    /// The model's chat template.
    pub template: ChatTemplate,
    /// Its `generation_config.json` defaults.
    pub generation: GenerationConfig,
    /// `enable_thinking` as the model was trained.
    pub enable_thinking: bool,
    /// The LoRA adapter its requests run through (read at each request, so a replaced
    /// adapter takes the next one); `None`: the base weights.
    pub adapter: Option<Arc<parking_lot::RwLock<crate::engine::AdapterHandle>>>,
}

/// A policy over a loaded model; one per episode, all sharing the model's engine.
pub struct ModelPolicy {
    model: Arc<PolicyModel>,
    episode: EpisodeConfig,
    transcript: Vec<Message>,
    last: Option<Action>,
    last_prompt: Option<String>,
    /// Append-only mode: the previous prompt's tokens plus what was generated.
    context_ids: Option<Vec<u32>>,
    seed: u64,
    steps: u64,
    /// The transcript's KV, pinned in the tiers below the GPU while the episode is open
    /// (released when the policy drops).
    kv_pin: Option<crate::engine::KvPin>,
}

impl std::fmt::Debug for ModelPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelPolicy")
            .field("model", &self.model.key)
            .field("steps", &self.steps)
            .finish()
    }
}

impl ModelPolicy {
    /// A fresh episode on `model`. A constraint the grammar engine cannot compile is refused
    /// here ([`Error::Grammar`](crate::Error::Grammar), naming the tool), before any step.
    pub fn new(model: impl Into<PolicyModel>, episode: EpisodeConfig) -> Result<Self> {
        let model = Arc::new(model.into());
        if let Some(c) = &episode.constraint {
            let compiler = model.engine.grammar_compiler()?;
            c.compile(compiler, &episode.tools, model.enable_thinking)?;
        }
        let mut transcript = Vec::new();
        if let Some(sys) = &episode.system_prompt {
            transcript.push(Message::system(sys.clone()));
        }
        // No seed given: a fresh one per episode (RandomState carries per-instance random keys).
        let seed = episode.seed.unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            h.finish()
        });
        Ok(Self {
            model,
            episode,
            transcript,
            last: None,
            last_prompt: None,
            context_ids: None,
            seed,
            steps: 0,
            kv_pin: None,
        })
    }

    /// The prompt text of the last step, exactly as rendered by the template.
    pub fn last_prompt(&self) -> Option<&str> {
        self.last_prompt.as_deref()
    }

    /// The sampling this policy uses for step `step`: the episode's temperature, else the
    /// model's generation_config defaults (greedy when it does not sample).
    fn sampling(&self, step: u64) -> SamplingParams {
        SamplingParams::resolve(
            &self.model.generation,
            self.episode.temperature,
            self.episode.top_p,
            self.seed.wrapping_add(step),
        )
    }

    /// The prompt tokens of this turn: the rendered prompt tokenized (template mode), or the
    /// previous context plus the rendered tail after the last assistant turn (append-only).
    fn prompt_ids(&self, prompt: &str) -> Result<Vec<u32>> {
        let engine = &self.model.engine;
        let Some(prev) = self
            .context_ids
            .as_ref()
            .filter(|_| self.episode.transcript_mode == TranscriptMode::AppendOnly)
        else {
            return engine.tokenize(prompt);
        };
        const START: &str = "<|im_start|>assistant";
        const END: &str = "<|im_end|>";
        let tail = prompt
            .rfind(START)
            .and_then(|gen_at| prompt[..gen_at].rfind(START))
            .and_then(|a| prompt[a..].find(END).map(|e| a + e + END.len()))
            .map(|at| &prompt[at..]);
        let Some(tail) = tail else {
            tracing::warn!(
                "append-only transcript needs a ChatML template; using the full rendering"
            );
            return engine.tokenize(prompt);
        };
        let mut ids = prev.clone();
        let im_end = engine.tokenizer().token_to_id(END);
        if im_end.is_some() && ids.last().copied() != im_end {
            ids.extend(engine.tokenize(END)?);
        }
        ids.extend(engine.tokenize(tail)?);
        Ok(ids)
    }

    /// Renders the current transcript as the next prompt.
    pub fn render(&self) -> Result<String> {
        let tools = (!self.episode.tools.is_empty()).then_some(self.episode.tools.as_slice());
        let opts = RenderOptions {
            add_generation_prompt: true,
            enable_thinking: Some(self.model.enable_thinking),
        };
        self.model.template.render(&self.transcript, tools, opts)
    }
}

impl Policy for ModelPolicy {
    fn act(&mut self, observation: Observation) -> Result<Step> {
        self.act_cancellable(observation, &CancelToken::new())
    }

    fn act_cancellable(&mut self, observation: Observation, cancel: &CancelToken) -> Result<Step> {
        // An act is a transaction: on any error (a cancel included) the transcript is exactly
        // as before (a retrying harness does not duplicate observations); everything else
        // `step` changes is set only after the generation succeeded.
        let mark = self.transcript.len();
        push_observation(&mut self.transcript, self.last.as_ref(), observation);
        let result = self.step(cancel);
        if result.is_err() {
            self.transcript.truncate(mark);
        }
        result
    }

    fn transcript(&self) -> &[Message] {
        &self.transcript
    }

    fn model_key(&self) -> &str {
        &self.model.key
    }
}

impl ModelPolicy {
    /// Renders, generates and parses one step over the transcript (the observation is in it).
    /// Nothing but the transcript's tail changes before the generation succeeded.
    fn step(&mut self, cancel: &CancelToken) -> Result<Step> {
        let start = Instant::now();
        let prompt = self.render()?;
        let engine = &self.model.engine;
        let ids = self.prompt_ids(&prompt)?;
        if let Some(cap) = self.episode.max_transcript_tokens
            && ids.len() > cap
        {
            return Err(crate::error::Error::TooLarge(format!(
                "the episode's prompt is {} tokens, over its cap of {cap} (max_transcript_tokens); start a new episode",
                ids.len()
            )));
        }
        let mut transcript_ids = ids.clone();
        let mut request = GenerationRequest::new(ids).sampling(self.sampling(self.steps));
        request.max_new_tokens = self.episode.max_new_tokens;
        request.adapter = self.model.adapter.as_ref().map(|a| a.read().clone());
        if let Some(c) = &self.episode.constraint {
            let compiler = engine.grammar_compiler()?;
            request.grammar =
                Some(c.compile(compiler, &self.episode.tools, self.model.enable_thinking)?);
        }
        let adapter = request.adapter.clone();
        let generation = engine.submit(request).wait_cancellable(cancel)?;
        transcript_ids.extend_from_slice(&generation.tokens);
        // The next turn starts with this transcript: pin its KV while the episode waits for
        // its tool (the previous pin goes when this one replaces it).
        self.kv_pin = Some(engine.pin_kv(transcript_ids.clone(), adapter.as_ref()));
        if self.episode.transcript_mode == TranscriptMode::AppendOnly {
            self.context_ids = Some(transcript_ids);
        }
        let raw = generation.text.clone();
        let tools = (!self.episode.tools.is_empty()).then_some(self.episode.tools.as_slice());
        let action = parse_output(&raw, tools).into_action(&raw);
        self.transcript.push(assistant_message(&action));
        self.last = Some(action.clone());
        self.last_prompt = Some(prompt);
        self.steps += 1;
        Ok(Step {
            action,
            raw,
            cost: StepCost {
                prompt_tokens: generation.prompt_tokens,
                cached_prompt_tokens: generation.cached_prompt_tokens,
                cached_prompt_tokens_tiers: (
                    generation.cached_prompt_tokens_host,
                    generation.cached_prompt_tokens_disk,
                ),
                generated_tokens: generation.generated_tokens,
                latency: start.elapsed(),
                weights_version: Some(generation.weights_version.clone()),
            },
        })
    }
}
