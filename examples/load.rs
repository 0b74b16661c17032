//! Load generator for the HTTP host, reporting what vLLM's `benchmark_serving` reports.
//!
//!     cargo run --release --example serve -- --model-dir m=/models/m &
//!     cargo run --release --example load -- --model m --requests 500 --input-len 512 --output-len 128
//!     cargo run --release --example load -- --model m --agent 64,10      # episodes API
//!
//! Chat mode: N chat completions (streamed; plain JSON with `--no-stream`, where TTFT is the
//! whole request's and TPOT is not measured) with prompts of random words (about `--input-len`
//! tokens) or the lines of `--prompt-file`, `--output-len` tokens each (`ignore_eos` and
//! `min_tokens`, vLLM's extensions), all at once or at a Poisson `--rate`, at most
//! `--concurrency` in flight. Reports request throughput, output and total tok/s, TTFT, TPOT
//! and end-to-end latency (p50/p99), failures. Agent mode: E episodes x T turns through the
//! episodes API (shared ~700-token system prompt + tool schemas, ~100-token tool results);
//! reports prompt tokens served from the prefix cache and turn latency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::StreamExt;
use serde_json::{Value, json};

#[derive(Parser, Debug, Clone)]
#[command(name = "load", about = "Load generator for the policy-serve HTTP host")]
struct Args {
    /// Server base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base: String,
    /// Model key.
    #[arg(long)]
    model: String,
    /// Requests to send (chat mode).
    #[arg(long, default_value_t = 100)]
    requests: usize,
    /// Prompt length in tokens (about: random words).
    #[arg(long, default_value_t = 512)]
    input_len: usize,
    /// Output tokens per request.
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// Prompts from this file, one per line, instead of random words.
    #[arg(long)]
    prompt_file: Option<std::path::PathBuf>,
    /// Requests per second (Poisson arrivals); absent: all at once.
    #[arg(long)]
    rate: Option<f64>,
    /// Most requests in flight.
    #[arg(long, default_value_t = 10_000)]
    concurrency: usize,
    /// Seed of the prompts and arrivals.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Bearer token (env POLICY_SERVE_TOKEN).
    #[arg(long, env = "POLICY_SERVE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Agent workload instead: EPISODES,TURNS through the episodes API.
    #[arg(long)]
    agent: Option<String>,
    /// Chat mode: first send every prompt alone (greedy), then compare the loaded run's texts
    /// with those (preemption must not change a greedy output); reports the engine's
    /// preemption and swap counters from /metrics.
    #[arg(long)]
    compare_unloaded: bool,
    /// Chat mode: plain non-streaming requests (`"stream": false`), as a client without SSE
    /// sends them; the time to the first token is then the whole request's.
    #[arg(long)]
    no_stream: bool,
    /// Agent mode: the episodes' transcript mode (template or append_only).
    #[arg(long, default_value = "append_only")]
    transcript_mode: String,
    /// Agent mode: words per tool result (about 1.3 tokens each).
    #[arg(long, default_value_t = 75)]
    tool_result_words: usize,
    /// Agent mode: the tool's latency before each turn after the first (milliseconds): the
    /// episode sits paused, its transcript's KV free to leave the GPU.
    #[arg(long, default_value_t = 0)]
    think_ms: u64,
}

/// SplitMix64 for prompts and arrivals.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const WORDS: &[&str] = &[
    "table", "query", "users", "orders", "count", "select", "where", "group", "price", "date",
    "region", "total", "average", "join", "index", "value", "report", "monthly", "customer",
    "product", "shipped", "status", "limit", "distinct", "between", "summary", "revenue", "rows",
];

fn words(rng: &mut Rng, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[(rng.next() % WORDS.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn client(args: &Args) -> reqwest::RequestBuilder {
    let c = reqwest::Client::new().post(format!("{}/v1/chat/completions", args.base));
    match &args.token {
        Some(t) => c.bearer_auth(t),
        None => c,
    }
}

/// Sends one chat request for `prompt` (streamed unless `--no-stream`): the time it was sent
/// and the successful response.
async fn send(args: &Args, prompt: String) -> Result<(Instant, reqwest::Response), String> {
    let mut body = json!({"model": args.model, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": args.output_len, "min_tokens": args.output_len, "ignore_eos": true,
        "temperature": 0, "stream": !args.no_stream});
    if !args.no_stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    let t0 = Instant::now();
    let resp = client(args)
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!(
            "{} {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        ));
    }
    Ok((t0, resp))
}

/// One completion, streamed unless `--no-stream`: (TTFT, end-to-end, prompt tokens, completion
/// tokens, text).
async fn one(args: Arc<Args>, prompt: String) -> Result<(f64, f64, u64, u64, String), String> {
    let (t0, resp) = send(&args, prompt).await?;
    if args.no_stream {
        return one_plain(t0, resp).await;
    }
    let mut stream = resp.bytes_stream();
    let (mut ttft, mut usage, mut buf, mut text) = (None, None, String::new(), String::new());
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.map_err(|e| e.to_string())?));
        while let Some(at) = buf.find("\n\n") {
            let event: String = buf.drain(..at + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
            if v.get("error").is_some() {
                return Err(v["error"]["message"].to_string());
            }
            let content = v["choices"][0]["delta"]["content"].as_str().unwrap_or("");
            text.push_str(content);
            if ttft.is_none() && !content.is_empty() {
                ttft = Some(t0.elapsed().as_secs_f64());
            }
            if v["usage"].is_object() {
                usage = Some((
                    v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                    v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
                ));
            }
        }
    }
    let e2e = t0.elapsed().as_secs_f64();
    let (p, c) = usage.ok_or("the stream carried no usage")?;
    Ok((ttft.unwrap_or(e2e), e2e, p, c, text))
}

/// A non-streamed answer, sent at `t0`: it arrives whole, so its TTFT is its end-to-end time.
async fn one_plain(
    t0: Instant,
    resp: reqwest::Response,
) -> Result<(f64, f64, u64, u64, String), String> {
    let text = resp.text().await.map_err(|e| e.to_string())?;
    let e2e = t0.elapsed().as_secs_f64();
    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .ok_or("the answer has no message content")?
        .to_string();
    let usage = &v["usage"];
    Ok((
        e2e,
        e2e,
        usage["prompt_tokens"].as_u64().unwrap_or(0),
        usage["completion_tokens"].as_u64().unwrap_or(0),
        content,
    ))
}

async fn chat_mode(args: Arc<Args>) -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Rng(args.seed ^ 0x5EED);
    let file_prompts: Vec<String> = match &args.prompt_file {
        Some(f) => std::fs::read_to_string(f)?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
        None => vec![],
    };
    let prompts: Vec<String> = (0..args.requests)
        .map(|i| {
            if file_prompts.is_empty() {
                // About 1.3 tokens per word with the Qwen3 tokenizer.
                format!("{i} {}", words(&mut rng, args.input_len * 10 / 13))
            } else {
                file_prompts[i % file_prompts.len()].clone()
            }
        })
        .collect();
    let mut unloaded = Vec::new();
    if args.compare_unloaded {
        for p in &prompts {
            unloaded.push(one(args.clone(), p.clone()).await.map(|r| r.4));
        }
    }
    let sem = Arc::new(tokio::sync::Semaphore::new(args.concurrency.max(1)));
    let bar = indicatif::ProgressBar::new(args.requests as u64);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(args.requests);
    for prompt in prompts {
        if let Some(rate) = args.rate {
            let wait = -(1.0 - rng.unit()).ln() / rate;
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
        let permit = sem.clone().acquire_owned().await?;
        let (a, b) = (args.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let r = one(a, prompt).await;
            b.inc(1);
            drop(permit);
            r
        }));
    }
    let mut ok = Vec::new();
    let mut failures = Vec::new();
    let mut equal = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await? {
            Ok(r) => {
                if unloaded
                    .get(i)
                    .is_some_and(|u| u.as_ref().is_ok_and(|u| *u == r.4))
                {
                    equal += 1;
                }
                ok.push(r);
            }
            Err(e) => failures.push(e),
        }
    }
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let (prompt_tok, out_tok): (u64, u64) = ok
        .iter()
        .map(|r| (r.2, r.3))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let mut ttft: Vec<f64> = ok.iter().map(|r| r.0 * 1e3).collect();
    let mut tpot: Vec<f64> = ok
        .iter()
        .filter(|r| r.3 > 1)
        .map(|r| (r.1 - r.0) * 1e3 / (r.3 - 1) as f64)
        .collect();
    let mut e2e: Vec<f64> = ok.iter().map(|r| r.1 * 1e3).collect();
    println!(
        "successful requests: {} (failed {})",
        ok.len(),
        failures.len()
    );
    println!(
        "mode: {}",
        if args.no_stream {
            "non-streamed"
        } else {
            "streamed"
        }
    );
    println!("duration s: {secs:.2}");
    println!("request throughput req/s: {:.2}", ok.len() as f64 / secs);
    println!(
        "output token throughput tok/s: {:.1}",
        out_tok as f64 / secs
    );
    println!(
        "total token throughput tok/s: {:.1}",
        (prompt_tok + out_tok) as f64 / secs
    );
    println!("prompt tokens: {prompt_tok}; output tokens: {out_tok}");
    println!(
        "TTFT ms p50 {:.1} p99 {:.1}",
        pct(&mut ttft, 0.5),
        pct(&mut ttft, 0.99)
    );
    if args.no_stream {
        println!("TPOT ms: not measured (non-streamed)");
    } else {
        println!(
            "TPOT ms p50 {:.2} p99 {:.2}",
            pct(&mut tpot, 0.5),
            pct(&mut tpot, 0.99)
        );
    }
    println!(
        "E2E ms p50 {:.1} p99 {:.1}",
        pct(&mut e2e, 0.5),
        pct(&mut e2e, 0.99)
    );
    if let Some(e) = failures.first() {
        println!("first failure: {e}");
    }
    if args.compare_unloaded {
        println!(
            "greedy outputs equal to the unloaded run: {equal}/{}",
            args.requests
        );
        let mut m = reqwest::Client::new().get(format!("{}/metrics", args.base));
        if let Some(t) = &args.token {
            m = m.bearer_auth(t);
        }
        let text = m.send().await?.text().await?;
        for line in text.lines().filter(|l| {
            l.starts_with("policy_serve_preemptions_total")
                || l.starts_with("policy_serve_swap_outs_total")
        }) {
            println!("{line}");
        }
    }
    Ok(())
}

async fn agent_mode(args: Arc<Args>, spec: &str) -> Result<(), Box<dyn std::error::Error>> {
    let (e, t) = spec.split_once(',').ok_or("--agent EPISODES,TURNS")?;
    let (episodes, turns): (usize, usize) = (e.parse()?, t.parse()?);
    let mut rng = Rng(args.seed ^ 0xA6E);
    let system = format!("You are a careful SQL analyst. {}", words(&mut rng, 520));
    let tools = json!([
        {"type": "function", "function": {"name": "query", "description": "Run a read-only SQL query and return rows", "parameters": {"type": "object", "properties": {"sql": {"type": "string", "description": "The SQL"}}, "required": ["sql"]}}},
        {"type": "function", "function": {"name": "describe", "description": "Describe a table's columns", "parameters": {"type": "object", "properties": {"table": {"type": "string"}}, "required": ["table"]}}},
        {"type": "function", "function": {"name": "sample", "description": "Sample rows of a table", "parameters": {"type": "object", "properties": {"table": {"type": "string"}, "n": {"type": "integer"}}, "required": ["table"]}}},
        {"type": "function", "function": {"name": "answer", "description": "Submit the final answer", "parameters": {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}}}
    ]);
    let http = reqwest::Client::new();
    let (base, token) = (args.base.clone(), args.token.clone());
    let post = move |path: String, body: Value| {
        let r = http.post(format!("{base}{path}")).json(&body);
        match &token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    };
    let bar = indicatif::ProgressBar::new((episodes * turns) as u64);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for ep in 0..episodes {
        let create = json!({"model": args.model, "system_prompt": system, "tools": tools, "max_tokens": 40,
            "temperature": 0, "transcript_mode": args.transcript_mode});
        let created: Value = post("/v1/episodes".into(), create)
            .send()
            .await?
            .json()
            .await?;
        let id = created["id"]
            .as_str()
            .ok_or_else(|| format!("create failed: {created}"))?
            .to_string();
        let observations: Vec<String> = (0..turns)
            .map(|t| {
                if t == 0 {
                    format!("Task {ep}: how many orders shipped last month?")
                } else {
                    format!("rows: {}", words(&mut rng, args.tool_result_words))
                }
            })
            .collect();
        let (post_ep, b) = (post.clone(), bar.clone());
        let think = Duration::from_millis(args.think_ms);
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for (turn, obs) in observations.into_iter().enumerate() {
                if turn > 0 {
                    tokio::time::sleep(think).await;
                }
                let t0 = Instant::now();
                let r = post_ep(
                    format!("/v1/episodes/{id}/act"),
                    json!({"observation": obs}),
                )
                .send()
                .await;
                let v: Value = match r {
                    Ok(r) => r.json().await.unwrap_or(Value::Null),
                    Err(e) => json!({"error": e.to_string()}),
                };
                b.inc(1);
                out.push((t0.elapsed().as_secs_f64() * 1e3, v));
            }
            out
        }));
    }
    let (mut lat, mut prompt, mut cached, mut failed) = (Vec::new(), 0u64, 0u64, 0usize);
    let (mut host, mut disk) = (0u64, 0u64);
    // The most a cache could serve: each turn's prompt up to the previous turn's prompt and
    // answer (the first turn: all but its ~32-token task line, the system prompt being shared).
    let mut reusable = 0u64;
    for t in tasks {
        let mut prev: Option<u64> = None;
        for (ms, v) in t.await? {
            if v.get("cost").is_none() {
                failed += 1;
                prev = None;
                continue;
            }
            let p = v["cost"]["prompt_tokens"].as_u64().unwrap_or(0);
            reusable += match prev {
                Some(before) => before.min(p),
                None => p.saturating_sub(32),
            };
            prev = Some(p + v["cost"]["generated_tokens"].as_u64().unwrap_or(0));
            lat.push(ms);
            prompt += v["cost"]["prompt_tokens"].as_u64().unwrap_or(0);
            cached += v["cost"]["cached_prompt_tokens"].as_u64().unwrap_or(0);
            host += v["cost"]["cached_prompt_tokens_host"].as_u64().unwrap_or(0);
            disk += v["cost"]["cached_prompt_tokens_disk"].as_u64().unwrap_or(0);
        }
    }
    bar.finish_and_clear();
    println!(
        "agent {episodes} x {turns} ({}, think {} ms): turns {} failed {failed}; prompt tokens {prompt}, from the prefix cache {cached} ({:.1}% of at most {:.1}% reusable: GPU {:.1}%, host {:.1}%, disk {:.1}%); turn ms p50 {:.1} p99 {:.1}; wall s {:.2}",
        args.transcript_mode,
        args.think_ms,
        lat.len(),
        100.0 * cached as f64 / prompt.max(1) as f64,
        100.0 * reusable as f64 / prompt.max(1) as f64,
        100.0 * (cached - host - disk) as f64 / prompt.max(1) as f64,
        100.0 * host as f64 / prompt.max(1) as f64,
        100.0 * disk as f64 / prompt.max(1) as f64,
        pct(&mut lat.clone(), 0.5),
        pct(&mut lat, 0.99),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

#[tokio::main]
async fn main() {
    let args = Arc::new(Args::parse());
    let r = match args.agent.clone() {
        Some(spec) => agent_mode(args, &spec).await,
        None => chat_mode(args).await,
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
