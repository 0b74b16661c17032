//! `ModelPolicy`: a per-episode policy over a loaded model. Renders the transcript through the
//! model's own chat template, generates on the shared engine, parses the output into an action.

use std::sync::Arc;
use std::time::Instant;

use super::format::{RenderOptions, parse_output};
use super::{
    Action, EpisodeConfig, Message, Observation, Policy, Step, StepCost, assistant_message,
    push_observation,
};
use crate::engine::{GenerationRequest, SamplingParams};
use crate::error::Result;
use crate::registry::LoadedModel;

/// A policy over a loaded model; one per episode, all sharing the model's engine.
pub struct ModelPolicy {
    model: Arc<LoadedModel>,
    episode: EpisodeConfig,
    transcript: Vec<Message>,
    last: Option<Action>,
    last_prompt: Option<String>,
    seed: u64,
    steps: u64,
}

impl std::fmt::Debug for ModelPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelPolicy")
            .field("model", &self.model.spec().key)
            .field("steps", &self.steps)
            .finish()
    }
}

impl ModelPolicy {
    /// A fresh episode on `model`.
    pub fn new(model: Arc<LoadedModel>, episode: EpisodeConfig) -> Result<Self> {
        let mut transcript = Vec::new();
        if let Some(sys) = &episode.system_prompt {
            transcript.push(Message::system(sys.clone()));
        }
        let seed = episode.seed.unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(Instant::now().elapsed().as_nanos());
            h.finish()
        });
        Ok(Self {
            model,
            episode,
            transcript,
            last: None,
            last_prompt: None,
            seed,
            steps: 0,
        })
    }

    /// The prompt text of the last step, exactly as rendered by the template.
    pub fn last_prompt(&self) -> Option<&str> {
        self.last_prompt.as_deref()
    }

    /// The sampling this policy uses for step `step`: the episode's temperature, else the
    /// model's generation_config defaults (greedy when it does not sample).
    fn sampling(&self, step: u64) -> SamplingParams {
        let g = self.model.generation_config();
        let temperature = self.episode.temperature.unwrap_or(if g.do_sample {
            g.temperature.unwrap_or(1.0)
        } else {
            0.0
        });
        SamplingParams {
            temperature,
            top_k: g.top_k,
            top_p: g.top_p,
            seed: self.seed.wrapping_add(step),
        }
    }

    /// Renders the current transcript as the next prompt.
    pub fn render(&self) -> Result<String> {
        let tools = (!self.episode.tools.is_empty()).then_some(self.episode.tools.as_slice());
        let opts = RenderOptions {
            add_generation_prompt: true,
            enable_thinking: Some(self.model.spec().enable_thinking),
        };
        self.model.template().render(&self.transcript, tools, opts)
    }
}

impl Policy for ModelPolicy {
    fn act(&mut self, observation: Observation) -> Result<Step> {
        let start = Instant::now();
        push_observation(&mut self.transcript, self.last.as_ref(), observation);
        let prompt = self.render()?;
        let engine = self.model.engine();
        let ids = engine.tokenize(&prompt)?;
        let mut request = GenerationRequest::new(ids).sampling(self.sampling(self.steps));
        request.max_new_tokens = self.episode.max_new_tokens;
        let generation = engine.generate(request)?;
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
                generated_tokens: generation.generated_tokens,
                latency: start.elapsed(),
            },
        })
    }

    fn transcript(&self) -> &[Message] {
        &self.transcript
    }

    fn model_key(&self) -> &str {
        &self.model.spec().key
    }
}
