//! A minimal host: run one episode with the demo policy (or any registry key) against a toy
//! environment.
//!
//!     cargo run --example episode                 # the demo, no download
//!     cargo run --example episode -- qwen3-0.6b   # the real model (downloads from the hub)

use policy_serve::{Action, EpisodeConfig, ModelRegistry, Observation, ToolDefinition};

fn main() -> policy_serve::Result<()> {
    let key = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "demo".to_string());
    let registry = ModelRegistry::with_defaults();
    let tools = vec![
        ToolDefinition::new("add", "Add two integers")
            .param("a", "integer", "first", true)
            .param("b", "integer", "second", true),
        ToolDefinition::new("final_answer", "Give the final answer").param(
            "value",
            "integer",
            "the answer",
            true,
        ),
    ];
    let episode = EpisodeConfig::with_tools(tools)
        .system("Use the tools to compute, then give the final answer.");
    let mut policy = registry.get_policy(&key, episode)?;
    let mut observation: Observation = "What is 2 + 3?".into();
    for step_no in 1..=6 {
        let step = policy.act(observation)?;
        println!("step {step_no}: {:?}", step.action);
        observation = match step.action {
            Action::Call { calls, .. } if calls[0].name == "final_answer" => break,
            Action::Call { calls, .. } => {
                let a = calls[0]
                    .arguments
                    .get("a")
                    .and_then(|v| v.as_i64())
                    .unwrap_or(0);
                let b = calls[0]
                    .arguments
                    .get("b")
                    .and_then(|v| v.as_i64())
                    .unwrap_or(0);
                format!("{}", a + b).into()
            }
            Action::Reply { .. } => break,
            Action::Invalid { error, .. } => format!("invalid tool call: {error}").into(),
        };
    }
    Ok(())
}
