//! What an episode is made of: the [`Policy`] trait, its [`Observation`]s and [`Step`]s (an
//! [`Action`] with its raw text and [`StepCost`]), the [`EpisodeConfig`] a policy is made
//! with, and how every policy appends to its transcript.

use super::format::OutputConstraint;
use std::time::Duration;

use serde::Serialize;

use super::format::{Message, ParsedOutput, ToolCall, ToolDefinition};
use crate::engine::CancelToken;
use crate::error::Result;

/// What the policy does this step.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Action {
    /// Call one or more tools; `content` is any text the model wrote around the calls.
    Call {
        /// The calls, in order.
        calls: Vec<ToolCall>,
        /// Text outside the calls (often empty).
        content: String,
    },
    /// A plain reply with no tool call (the episode usually ends here).
    Reply {
        /// The reply text.
        content: String,
    },
    /// The model's output was not a valid action; `error` says why in words.
    Invalid {
        /// The raw output.
        raw: String,
        /// Why it is invalid.
        error: String,
    },
}

impl Action {
    /// The calls of a `Call` action; empty otherwise.
    pub fn calls(&self) -> &[ToolCall] {
        match self {
            Action::Call { calls, .. } => calls,
            _ => &[],
        }
    }
}

/// What the environment answers: the task on the first step, later the tool results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// One text: the task, a single tool result, or feedback after a reply.
    Text(String),
    /// One result per call of the previous multi-call action, in order.
    ToolResults(Vec<String>),
}

impl From<&str> for Observation {
    fn from(s: &str) -> Self {
        Observation::Text(s.to_string())
    }
}

impl From<String> for Observation {
    fn from(s: String) -> Self {
        Observation::Text(s)
    }
}

impl From<Vec<String>> for Observation {
    fn from(v: Vec<String>) -> Self {
        Observation::ToolResults(v)
    }
}

impl Observation {
    pub(super) fn into_texts(self) -> Vec<String> {
        match self {
            Observation::Text(t) => vec![t],
            Observation::ToolResults(v) => v,
        }
    }

    /// All of it as one text (several tool results joined by newlines).
    pub(super) fn joined(&self) -> String {
        match self {
            Observation::Text(t) => t.clone(),
            Observation::ToolResults(v) => v.join("\n"),
        }
    }
}

/// What one step cost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StepCost {
    /// Tokens in the prompt of this step (0 for the demo, which has no tokenizer).
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache instead of being computed.
    pub cached_prompt_tokens: usize,
    /// Of `cached_prompt_tokens`, those loaded back from the host and the disk KV tiers
    /// (the episode's transcript left the GPU while it was paused).
    pub cached_prompt_tokens_tiers: (usize, usize),
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Wall time of the step.
    pub latency: Duration,
    /// The weights that produced the step (`None`: the demo, which has none).
    pub weights_version: Option<crate::engine::WeightsVersion>,
}

/// One step of an episode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// The action taken.
    pub action: Action,
    /// The raw text the policy produced.
    pub raw: String,
    /// What it cost.
    pub cost: StepCost,
}

/// How an episode is set up: the system prompt and the tools the policy may call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EpisodeConfig {
    /// Optional system prompt (rendered first, before the tool block as the template does).
    pub system_prompt: Option<String>,
    /// Tools offered to the model.
    pub tools: Vec<ToolDefinition>,
    /// Maximum tokens generated per step (`None`: the engine's default).
    pub max_new_tokens: Option<usize>,
    /// Sampling temperature (`None`: the model's generation_config; `Some(0.0)`: greedy).
    pub temperature: Option<f32>,
    /// Nucleus sampling mass (`None`: the model's generation_config).
    pub top_p: Option<f32>,
    /// Cap on a step's prompt (the rendered transcript) in tokens; a step over it fails with
    /// `Error::TooLarge` and leaves the transcript as it was (`None`: the model's context).
    pub max_transcript_tokens: Option<usize>,
    /// Sampling seed for reproducible episodes.
    pub seed: Option<u64>,
    /// How the prompt of each turn is built (see [`TranscriptMode`]).
    pub transcript_mode: TranscriptMode,
    /// What the policy's answers may be (see [`OutputConstraint`]): with
    /// `ToolChoice::Required`, every step is one or more calls that parse and whose arguments
    /// are valid against their tools' schemas. `None`: unconstrained (answers are parsed, and
    /// may be `Action::Invalid`). Model policies only; the demo policy follows its script.
    pub constraint: Option<OutputConstraint>,
}

/// How a model policy builds the prompt of each turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TranscriptMode {
    /// Re-render the whole transcript through the chat template every turn: prompts are
    /// exactly what the template (and HF) produce, as in training. Qwen3's template renders
    /// earlier assistant turns without the empty `<think></think>` the generation prompt had,
    /// so the prefix cache reuses everything up to the last assistant turn, not the turn itself.
    #[default]
    Template,
    /// Append only: the next prompt is the previous prompt's tokens, the generated tokens
    /// as generated (ending in `<|im_end|>`), then the template's rendering of the new
    /// observation. Every earlier token is reused from the prefix cache. What changes: the
    /// model sees its own earlier turns exactly as it produced them (with the empty think
    /// block and its own whitespace) instead of the template's re-rendering. For ChatML
    /// templates (Qwen3); other templates fall back to `Template` with a warning.
    AppendOnly,
}

impl EpisodeConfig {
    /// An episode with these tools and no system prompt.
    pub fn with_tools(tools: Vec<ToolDefinition>) -> Self {
        Self {
            tools,
            ..Self::default()
        }
    }

    /// Constrains the policy's answers (see [`EpisodeConfig::constraint`]).
    pub fn constrain(mut self, constraint: OutputConstraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Sets the system prompt.
    pub fn system(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }
}

/// A per-episode policy. Get a fresh one per episode from
/// `ModelRegistry::get_policy`.
///
/// The first observation is the task (rendered as a user message). After a `Call` action,
/// observations are the tool results (rendered as `tool` messages, one per call); after a
/// `Reply` or `Invalid` action, the observation is rendered as a user message.
pub trait Policy: Send + std::fmt::Debug {
    /// Takes one observation and returns the next step.
    fn act(&mut self, observation: Observation) -> Result<Step>;
    /// [`Policy::act`], given up as soon as `cancel` is set (a client that went away, an
    /// episode closed mid-act): the generation stops and the policy is left exactly as it
    /// was before the call, with [`Error::Cancelled`](crate::error::Error::Cancelled). The default
    /// checks the token once before acting (for policies whose act is instant).
    fn act_cancellable(&mut self, observation: Observation, cancel: &CancelToken) -> Result<Step> {
        if cancel.is_cancelled() {
            return Err(crate::error::Error::Cancelled(
                "the act was cancelled before it started".into(),
            ));
        }
        self.act(observation)
    }
    /// The conversation so far, as the template renders it.
    fn transcript(&self) -> &[Message];
    /// The registry key of the model behind this policy.
    fn model_key(&self) -> &str;
}

/// Appends an observation to a transcript the way every policy does (see [`Policy`]).
pub(crate) fn push_observation(
    transcript: &mut Vec<Message>,
    last: Option<&Action>,
    observation: Observation,
) {
    match last {
        Some(Action::Call { .. }) => {
            for text in observation.into_texts() {
                transcript.push(Message::tool(text));
            }
        }
        _ => {
            let text = observation.joined();
            transcript.push(Message::user(text));
        }
    }
}

/// The assistant message for an action (calls as `tool_calls`, so the template re-renders them).
pub(crate) fn assistant_message(action: &Action) -> Message {
    match action {
        Action::Call { calls, content } => Message::assistant_with_calls(
            content.clone(),
            calls.iter().map(ToolCall::to_message_call).collect(),
        ),
        Action::Reply { content } => Message::assistant(content.clone()),
        Action::Invalid { raw, .. } => Message::assistant(raw.clone()),
    }
}

impl ParsedOutput {
    /// Turns a parse into the policy's action: an error makes `Invalid` (never a guess),
    /// calls make `Call`, plain text makes `Reply`.
    pub fn into_action(self, raw: &str) -> Action {
        if let Some(error) = self.error {
            Action::Invalid {
                raw: raw.to_string(),
                error,
            }
        } else if !self.calls.is_empty() {
            Action::Call {
                calls: self.calls,
                content: self.content,
            }
        } else if self.content.is_empty() {
            Action::Invalid {
                raw: raw.to_string(),
                error: "the output holds neither a tool call nor any text".into(),
            }
        } else {
            Action::Reply {
                content: self.content,
            }
        }
    }
}
