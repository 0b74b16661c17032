//! `DemoPolicy`: a scripted, instant, deterministic policy that needs no model.
//!
//! With a script it plays the given actions in order, then replies. Without one it calls each
//! tool once with schema-valid arguments, then the finishing tool (named like answer / finish /
//! submit / final / done) if there is one, else replies with what it saw. Its raw text is what
//! the Qwen3 format would hold for the same action, so it parses back to the same action.

use std::time::Instant;

use super::episode::{
    Action, EpisodeConfig, Observation, Policy, Step, StepCost, assistant_message, push_observation,
};
use super::format::{self, ToolDefinition, example_arguments, format_tool_calls};
use super::format::{Message, ToolCall};
use crate::error::Result;

const FINISH_WORDS: [&str; 5] = ["answer", "finish", "submit", "final", "done"];

/// The scripted demo policy.
#[derive(Debug, Clone)]
pub struct DemoPolicy {
    key: String,
    tools: Vec<ToolDefinition>,
    script: Option<std::collections::VecDeque<Action>>,
    transcript: Vec<Message>,
    last: Option<Action>,
    step: usize,
}

impl DemoPolicy {
    /// A demo policy for an episode; it explores the episode's tools, then finishes.
    pub fn new(key: impl Into<String>, episode: &EpisodeConfig) -> Self {
        let mut transcript = Vec::new();
        if let Some(sys) = &episode.system_prompt {
            transcript.push(Message::system(sys.clone()));
        }
        Self {
            key: key.into(),
            tools: episode.tools.clone(),
            script: None,
            transcript,
            last: None,
            step: 0,
        }
    }

    /// Plays these actions in order instead (then replies "script finished").
    pub fn with_script(mut self, script: Vec<Action>) -> Self {
        self.script = Some(script.into());
        self
    }

    /// Starts as if `step` steps were already taken (a stateless host replaying a
    /// conversation asks for the action of its step `step` directly, in one act).
    pub fn at_step(mut self, step: usize) -> Self {
        self.step = step;
        self
    }

    fn finish_tool(&self) -> Option<&ToolDefinition> {
        self.tools.iter().find(|t| {
            let n = t.name().to_ascii_lowercase();
            FINISH_WORDS.iter().any(|w| n.contains(w))
        })
    }

    fn next_action(&mut self, observation: &str) -> Action {
        if let Some(script) = &mut self.script {
            return script.pop_front().unwrap_or_else(|| Action::Reply {
                content: "script finished".into(),
            });
        }
        let finish = self.finish_tool().map(|t| t.name().to_string());
        let explore: Vec<&ToolDefinition> = self
            .tools
            .iter()
            .filter(|t| Some(t.name()) != finish.as_deref())
            .collect();
        if let Some(tool) = explore.get(self.step) {
            return Action::Call {
                calls: vec![ToolCall {
                    name: tool.name().to_string(),
                    arguments: example_arguments(tool),
                }],
                content: String::new(),
            };
        }
        if self.step == explore.len()
            && let Some(tool) = self.finish_tool()
        {
            return Action::Call {
                calls: vec![ToolCall {
                    name: tool.name().to_string(),
                    arguments: example_arguments(tool),
                }],
                content: String::new(),
            };
        }
        Action::Reply {
            content: format!("Done. Last observation: {observation}"),
        }
    }
}

impl Policy for DemoPolicy {
    fn act(&mut self, observation: Observation) -> Result<Step> {
        let start = Instant::now();
        let text = observation.joined();
        push_observation(&mut self.transcript, self.last.as_ref(), observation);
        let action = self.next_action(&text);
        let raw = match &action {
            Action::Call { calls, content } if content.is_empty() => format_tool_calls(calls),
            Action::Call { calls, content } => format!("{content}\n{}", format_tool_calls(calls)),
            Action::Reply { content } => content.clone(),
            Action::Invalid { raw, .. } => raw.clone(),
        };
        // A scripted call is checked like a model's: the demo never emits what the parser rejects.
        let action = match action {
            Action::Call { .. } => {
                let tools = (!self.tools.is_empty()).then_some(self.tools.as_slice());
                format::parse_output(&raw, tools).into_action(&raw)
            }
            a => a,
        };
        self.transcript.push(assistant_message(&action));
        self.last = Some(action.clone());
        self.step += 1;
        Ok(Step {
            action,
            raw,
            cost: StepCost {
                latency: start.elapsed(),
                ..StepCost::default()
            },
        })
    }

    fn transcript(&self) -> &[Message] {
        &self.transcript
    }

    fn model_key(&self) -> &str {
        &self.key
    }
}
