//! The agent workload: episodes of several turns through `ModelPolicy`, with the prefix
//! cache on and off.

use super::*;

/// N concurrent episodes x T turns through ModelPolicy: a ~700-token system prompt + tool
/// schemas, ~100-token tool results, ~40-token actions. Prints prefill tokens computed vs
/// total, hit rate and time per turn.
pub(super) fn agent_workload(
    dir: &Path,
    opts: &EngineOptions,
    n: usize,
    turns: usize,
    cache: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    use policy_serve::{EpisodeConfig, ModelPolicy, Observation, Policy, ToolDefinition};
    let registry = ModelRegistry::new(vec![ModelSpec::local("bench", "bench", dir)])?.with_options(
        EngineOptions {
            prefix_cache: cache,
            max_running: Some(n.max(1)),
            ..opts.clone()
        },
    );
    let model = registry.model("bench")?;
    let engine = model.engine().clone();
    let long = |what: &str| {
        format!(
            "{what}. Results are returned as CSV with a header row; large results are truncated to the first 50 rows, so aggregate in SQL where you can. Table and column names are case-sensitive; quote identifiers that contain spaces. "
        )
    };
    let tools = vec![
        ToolDefinition::new(
            "list_tables",
            long("List every table in the database with its row count"),
        ),
        ToolDefinition::new(
            "describe",
            long("Describe the columns, types and foreign keys of one table"),
        )
        .param("table", "string", "The table name", true),
        ToolDefinition::new(
            "query",
            long("Run one read-only SQL query (SQLite dialect) against the database"),
        )
        .param("sql", "string", "The SQL query", true)
        .param("limit", "integer", "Maximum rows to return", false),
        ToolDefinition::new(
            "answer",
            long("Submit the final answer to the question; the episode ends"),
        )
        .param("value", "string", "The answer", true),
    ];
    let system = "You are a careful data analyst working for the finance team. You answer questions about the company's sales database by calling tools. Think about which tables hold the data, inspect their schema before querying, write correct SQLite, check that results make sense, and only then submit the answer with the answer tool. Never guess: if a query fails, read the error and fix the query. Keep each step to one tool call. ".repeat(2);
    let episode = EpisodeConfig {
        max_new_tokens: Some(40),
        temperature: Some(0.0),
        ..EpisodeConfig::with_tools(tools).system(system)
    };
    let before = engine.stats();
    let started = Instant::now();
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let model = model.clone();
            let episode = episode.clone();
            std::thread::spawn(move || -> policy_serve::Result<(usize, usize, f64)> {
                let mut p = ModelPolicy::new(model, episode)?;
                let (mut prompt, mut cached, mut secs) = (0, 0, 0.0);
                let mut obs: Observation = format!(
                    "Question {i}: which region had the highest total sales in Q{}?",
                    i % 4 + 1
                )
                .into();
                for t in 0..turns {
                    let step = p.act(obs)?;
                    prompt += step.cost.prompt_tokens;
                    cached += step.cost.cached_prompt_tokens;
                    secs += step.cost.latency.as_secs_f64();
                    let rows: String = (0..12)
                        .map(|r| {
                            format!("{r},region_{},{}.{}\n", (r + t) % 5, 1000 + r * 37 + i, r)
                        })
                        .collect();
                    obs = format!("id,region,total\n{rows}").into();
                }
                Ok((prompt, cached, secs))
            })
        })
        .collect();
    let mut prompt = 0;
    let mut cached = 0;
    let mut turn_secs = 0.0;
    for h in handles {
        let (p, c, s) = h.join().map_err(|_| "episode thread panicked")??;
        prompt += p;
        cached += c;
        turn_secs += s;
    }
    let wall = started.elapsed().as_secs_f64();
    let after = engine.stats();
    let computed = after.prefill_tokens - before.prefill_tokens;
    println!(
        "agent N={n} T={turns} cache={} prompt_tokens {prompt} prefill_computed {computed} ({:.1}%) cached {cached} hit_rate {:.3} mean_turn_ms {:.1} wall_s {wall:.2} evicted_blocks {} preemptions {}",
        if cache { "on" } else { "off" },
        100.0 * computed as f64 / prompt.max(1) as f64,
        cached as f64 / prompt.max(1) as f64,
        1e3 * turn_secs / (n * turns).max(1) as f64,
        after.evicted_blocks,
        after.preemptions
    );
    Ok(())
}
