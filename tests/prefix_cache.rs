//! The prefix cache wired into the engine, through ModelPolicy as a harness uses it.

mod common;

use std::sync::Arc;

use policy_serve::engine::DeviceChoice;
use policy_serve::{
    Action, EngineOptions, EpisodeConfig, ModelPolicy, ModelRegistry, Observation, Policy,
    ToolDefinition, TranscriptMode,
};

fn registry(prefix_cache: bool) -> ModelRegistry {
    common::tiny_registry(EngineOptions {
        device: DeviceChoice::Cpu,
        prefix_cache,
        ..EngineOptions::default()
    })
}

fn episode(mode: TranscriptMode) -> EpisodeConfig {
    let tools = vec![
        ToolDefinition::new(
            "query",
            "Run a read-only SQL query against the sales database and return rows as CSV",
        )
        .param("sql", "string", "SQL", true),
        ToolDefinition::new("describe", "Describe a table's columns and types").param(
            "table",
            "string",
            "table name",
            true,
        ),
        ToolDefinition::new("answer", "Submit the final answer")
            .param("value", "string", "answer", true),
    ];
    EpisodeConfig {
        max_new_tokens: Some(8),
        temperature: Some(0.0),
        transcript_mode: mode,
        ..EpisodeConfig::with_tools(tools)
            .system("You are a careful SQL analyst. Use the tools, then answer.")
    }
}

/// Runs `turns` turns; returns (raw outputs, (prompt tokens, cached tokens) per turn).
fn run(
    r: &ModelRegistry,
    mode: TranscriptMode,
    turns: usize,
    task: &str,
) -> (Vec<String>, Vec<(usize, usize)>) {
    let mut p = ModelPolicy::new(r.model("tiny").unwrap(), episode(mode)).unwrap();
    let mut obs: Observation = task.into();
    let (mut raws, mut costs) = (vec![], vec![]);
    for t in 0..turns {
        let step = p.act(obs).unwrap();
        costs.push((step.cost.prompt_tokens, step.cost.cached_prompt_tokens));
        raws.push(step.raw.clone());
        obs = match step.action {
            Action::Call { calls, .. } => Observation::ToolResults(
                calls
                    .iter()
                    .map(|c| format!("rows for {} at turn {t}", c.name))
                    .collect(),
            ),
            _ => format!("Tool result {t}: 42 rows, columns id,name,total").into(),
        };
    }
    (raws, costs)
}

#[test]
fn a_ten_turn_episode_reuses_most_of_each_prompt_and_outputs_equal_a_run_without_cache() {
    let (raw_on, costs) = run(
        &registry(true),
        TranscriptMode::Template,
        10,
        "Which region sold most?",
    );
    let (raw_off, costs_off) = run(
        &registry(false),
        TranscriptMode::Template,
        10,
        "Which region sold most?",
    );
    assert_eq!(raw_on, raw_off, "greedy outputs do not depend on the cache");
    assert!(
        costs_off.iter().all(|&(_, c)| c == 0),
        "positive control: no reuse with the cache off"
    );
    assert_eq!(costs[0].1, 0, "nothing cached before the first turn");
    for (turn, &(prompt, cached)) in costs.iter().enumerate().skip(1) {
        assert!(
            cached * 2 > prompt,
            "turn {}: only {cached} of {prompt} prompt tokens came from the cache",
            turn + 1
        );
    }
}

#[test]
fn append_only_mode_reuses_every_earlier_whole_block() {
    let r = registry(true);
    let (_, costs) = run(&r, TranscriptMode::AppendOnly, 6, "Which region sold most?");
    let bs = r.model("tiny").unwrap().engine().info().block_size;
    for w in costs.windows(2) {
        let (prev_prompt, _) = w[0];
        let (prompt, cached) = w[1];
        // Everything up to the end of the previous prompt (whole blocks) is reused.
        assert!(
            cached >= prev_prompt / bs * bs,
            "cached {cached} of {prompt}, previous prompt {prev_prompt}"
        );
    }
}

#[test]
fn sixteen_episodes_sharing_a_system_prompt_and_tools_compute_that_prefix_once() {
    let r = Arc::new(registry(true));
    let model = r.model("tiny").unwrap();
    let engine = model.engine().clone();
    let bs = engine.info().block_size;
    let before = engine.stats();
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let r = r.clone();
            std::thread::spawn(move || {
                let mut p =
                    ModelPolicy::new(r.model("tiny").unwrap(), episode(TranscriptMode::Template))
                        .unwrap();
                let s = p
                    .act(format!("Task number {i}: total sales in region {i}?").into())
                    .unwrap();
                (
                    s.cost.prompt_tokens,
                    s.cost.cached_prompt_tokens,
                    p.last_prompt().unwrap().to_string(),
                )
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // The shared prefix: the common start of the rendered prompts, in tokens, whole blocks.
    let ids: Vec<Vec<u32>> = results
        .iter()
        .map(|r| engine.tokenize(&r.2).unwrap())
        .collect();
    let shared = (0..ids[0].len())
        .take_while(|&k| ids.iter().all(|v| v.get(k) == ids[0].get(k)))
        .count();
    let shared_blocks = shared / bs * bs;
    assert!(
        shared_blocks > 100,
        "the system prompt and tools make a long shared prefix ({shared})"
    );
    let total_prompt: usize = results.iter().map(|r| r.0).sum();
    let computed = (engine.stats().prefill_tokens - before.prefill_tokens) as usize;
    assert!(
        computed <= total_prompt - 15 * shared_blocks,
        "prefill computed {computed} tokens of {total_prompt}; the {shared_blocks}-token shared prefix should be computed once"
    );
    assert_eq!(
        results.iter().filter(|r| r.1 >= shared_blocks).count(),
        15,
        "all but the first reuse it"
    );
}
