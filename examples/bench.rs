//! Engine benchmark with random weights in a real Qwen3 shape, against stock
//! candle-transformers `qwen3` on the same weights in the same run.
//!
//!     cargo run --release --example bench -- --config tests/fixtures/qwen3/config-0.6b.json
//!     (on the H200: build with --features cuda, see BENCHMARKS.md)
//!
//! Reports: first-forward latency cold (kernel load included) and warm; prefill tok/s; decode
//! tok/s at each batch size (prompt P, N new tokens, greedy, EOS ignored); with
//! `--compare-eager` the same decode rows on a second engine without CUDA graphs; the same
//! decode figures for candle-transformers; a logits check (ours vs candle-transformers).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::qwen3;
use clap::Parser;
use policy_serve::engine::{DTypeChoice, DeviceChoice, select_device};
use policy_serve::testing::{TensorRole, qwen3_tensor_specs};
use policy_serve::{EngineOptions, GenerationRequest, ModelRegistry, ModelSpec};

/// Engine benchmark with random weights in a real Qwen3 shape.
#[derive(Parser, Debug)]
#[command(name = "bench")]
struct Args {
    /// A Qwen3 config.json (the shape of the random model).
    #[arg(long, default_value = "tests/fixtures/qwen3/config-0.6b.json")]
    config: PathBuf,
    /// Decode batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
    batches: Vec<usize>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    /// New tokens per sequence.
    #[arg(long = "new", default_value_t = 128)]
    new_tokens: usize,
    /// Device: auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Compute dtype: auto, f32, bf16, f16.
    #[arg(long, default_value = "auto")]
    dtype: DTypeChoice,
    /// Skip the candle-transformers peer.
    #[arg(long)]
    no_peer: bool,
    /// Override the number of layers.
    #[arg(long)]
    layers: Option<usize>,
    /// Agent workload: EPISODES,TURNS.
    #[arg(long, value_parser = parse_pair)]
    agent: Option<(usize, usize)>,
    /// Skip the decode/prefill/peer part.
    #[arg(long)]
    agent_only: bool,
    /// Keep the random model in this directory.
    #[arg(long)]
    keep: Option<PathBuf>,
    /// Write the random model to this directory and exit.
    #[arg(long)]
    write_model: Option<PathBuf>,
    /// Use the model in this directory instead of writing one.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Tensor-parallel ranks (this process is rank 0; workers: `policy-serve worker`).
    #[arg(long, default_value_t = 1)]
    world_size: usize,
    /// Rendezvous of the tensor-parallel group.
    #[arg(long)]
    rendezvous: Option<std::net::SocketAddr>,
    /// Print the greedy tokens of a fixed batch of prompts (to compare runs).
    #[arg(long)]
    greedy_check: bool,
    /// At the end: wait for the file /tmp/policy-serve-killed, then try one request.
    #[arg(long)]
    kill_test: bool,
    /// Check the NCCL backend with a group of one on this GPU.
    #[arg(long)]
    nccl_selftest: bool,
    /// Time bare model decode steps (no scheduler) at each batch size.
    #[arg(long)]
    profile_step: bool,
    /// After the decode rows, the same rows on an engine without CUDA graphs.
    #[arg(long)]
    compare_eager: bool,
    /// Pipelined decode (`EngineOptions::pipelined_decode`).
    #[arg(long)]
    pipelined_decode: bool,
    /// Log the step profile every N steps (`EngineOptions::profile_steps`; 0: off).
    #[arg(long, default_value_t = 0)]
    profile_steps: u64,
    /// Skinny-matmul kernels off (`KernelOptions::gemv`).
    #[arg(long)]
    no_gemv: bool,
    /// Fused decode attention off (`KernelOptions::fused_decode`).
    #[arg(long)]
    no_fused_decode: bool,
    /// Thread-block clusters off (`KernelOptions::clusters`).
    #[arg(long)]
    no_clusters: bool,
    /// Programmatic dependent launch in graphs off (`KernelOptions::graph_pdl`).
    #[arg(long)]
    no_graph_pdl: bool,
}

fn parse_pair(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once(',').ok_or("expected N,T")?;
    Ok((
        a.parse().map_err(|e| format!("{e}"))?,
        b.parse().map_err(|e| format!("{e}"))?,
    ))
}

fn sync(dev: &Device) {
    dev.synchronize().expect("synchronize");
}

/// Writes config.json, tokenizer files and random weights (std 0.02, norms 1) to `dir`.
fn write_random_model(
    dir: &Path,
    cfg: &serde_json::Value,
    dtype: DType,
    dev: &Device,
) -> candle_core::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("config.json"), cfg.to_string())?;
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(Path::new("tests/fixtures/qwen3").join(f), dir.join(f))?;
    }
    let mcfg = policy_serve::engine::ModelConfig::from_json(&cfg.to_string())
        .map_err(|e| candle_core::Error::msg(e.to_string()))?;
    let h = mcfg.hidden_size;
    let mut t: HashMap<String, Tensor> = HashMap::new();
    for spec in qwen3_tensor_specs(&mcfg) {
        let tensor = match spec.role {
            TensorRole::Embedding => {
                (Tensor::randn(0f32, 0.02, spec.shape, dev)? * (h as f64).sqrt())?
            }
            TensorRole::Matrix => Tensor::randn(0f32, 0.02, spec.shape, dev)?,
            TensorRole::Norm => Tensor::ones(spec.shape, DType::F32, dev)?,
        };
        t.insert(spec.name, tensor.to_dtype(dtype)?.to_device(&Device::Cpu)?);
    }
    candle_core::safetensors::save(&t, dir.join("model.safetensors"))
}

/// N concurrent episodes x T turns through ModelPolicy: a ~700-token system prompt + tool
/// schemas, ~100-token tool results, ~40-token actions. Prints prefill tokens computed vs
/// total, hit rate and time per turn.
fn agent_workload(
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
            max_running: n.max(1),
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

/// Decode tok/s at each batch size of `a.batches` (prompt P, N new tokens, EOS ignored),
/// after a warm-up at the same batch size; prints one line per batch under `label`.
fn decode_rows(
    engine: &policy_serve::Engine,
    a: &Args,
    label: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let one = |p: Vec<u32>, n: usize| {
        let mut r = GenerationRequest::new(p).max_new_tokens(n);
        r.ignore_eos = true;
        r
    };
    for &b in &a.batches {
        let warm: Vec<_> = (0..b)
            .map(|i| engine.submit(one(prompt(a.prompt, 100 + i), 4)))
            .collect();
        for p in warm {
            p.wait()?;
        }
        let pending: Vec<_> = (0..b)
            .map(|i| engine.submit(one(prompt(a.prompt, 1000 + i), a.new_tokens)))
            .collect();
        let gens: Vec<_> = pending
            .into_iter()
            .map(|p| p.wait())
            .collect::<Result<_, _>>()?;
        let first = gens
            .iter()
            .map(|g| g.time_to_first_token)
            .max()
            .unwrap_or_default();
        let end = gens.iter().map(|g| g.total_time).max().unwrap_or_default();
        let decode_s = (end - first).as_secs_f64();
        let tps = (b * (a.new_tokens - 1)) as f64 / decode_s;
        println!(
            "{label} decode batch {b}: {tps:.0} tok/s ({:.3} ms/step; prefill of batch {:.0} ms)",
            decode_s * 1e3 / (a.new_tokens - 1) as f64,
            first.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

fn prompt(n: usize, salt: usize) -> Vec<u32> {
    policy_serve::testing::synthetic_prompt(n, salt)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    policy_serve::init_logging("warn");
    let a = Args::parse();
    let dev = select_device(a.device)?;
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&a.config)?)?;
    if let Some(l) = a.layers {
        cfg["num_hidden_layers"] = l.into();
    }
    let dtype = a.dtype.resolve(&dev, Some(DType::BF16));
    let write = |dir: &Path| -> Result<(), Box<dyn std::error::Error>> {
        let t0 = Instant::now();
        write_random_model(dir, &cfg, dtype, &dev)?;
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "# random {} weights ({dtype:?}) written in {secs:.1}s to {}",
            a.config.display(),
            dir.display()
        );
        Ok(())
    };
    if let Some(out) = &a.write_model {
        write(out)?;
        return Ok(());
    }
    let owned_dir = a.model_dir.is_none();
    let dir = match &a.model_dir {
        Some(d) => {
            cfg = serde_json::from_str(&std::fs::read_to_string(d.join("config.json"))?)?;
            d.clone()
        }
        None => {
            let dir =
                std::env::temp_dir().join(format!("policy-serve-bench-{}", std::process::id()));
            write(&dir)?;
            dir
        }
    };
    if a.nccl_selftest {
        nccl_selftest(&dir, &cfg, dtype, &dev)?;
    }
    if a.profile_step {
        profile_steps(&dir, &cfg, dtype, &dev, &a)?;
    }

    #[allow(unused_mut)]
    let mut opts = EngineOptions {
        device: a.device,
        dtype: a.dtype,
        max_running: a.batches.iter().copied().max().unwrap_or(1).max(1),
        max_batched_tokens: 8192,
        prefill_chunk: 2048,
        pipelined_decode: a.pipelined_decode,
        profile_steps: (a.profile_steps > 0).then_some(a.profile_steps),
        kernels: policy_serve::engine::KernelOptions {
            gemv: !a.no_gemv,
            fused_decode: !a.no_fused_decode,
            clusters: !a.no_clusters,
            graph_pdl: !a.no_graph_pdl,
            ..Default::default()
        },
        ..EngineOptions::default()
    };
    if a.world_size > 1 {
        opts.tensor_parallel = Some(tp_link(&a, &dev)?);
        println!("# tensor-parallel: rank 0 of {}", a.world_size);
    }
    if a.agent_only {
        if let Some((n, t)) = a.agent {
            for cache in [true, false] {
                agent_workload(&dir, &opts, n, t, cache)?;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    let registry = ModelRegistry::new(vec![ModelSpec::local("bench", "bench", &dir)])?
        .with_options(opts.clone());
    let t_load = Instant::now();
    let model = registry.model("bench")?;
    let load_s = t_load.elapsed().as_secs_f64();
    let engine = model.engine().clone();
    println!("# engine: {:?}; load {:.2}s", engine.info(), load_s);

    let one = |p: Vec<u32>, n: usize| {
        let mut r = GenerationRequest::new(p).max_new_tokens(n);
        r.ignore_eos = true;
        r
    };
    let t = Instant::now();
    engine.generate(one(prompt(16, 0), 1))?;
    let cold_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    engine.generate(one(prompt(16, 1), 1))?;
    let warm_ms = t.elapsed().as_secs_f64() * 1e3;
    println!("ours first_forward_ms cold {cold_ms:.1} warm {warm_ms:.1}");

    // Prefill: one prompt of P tokens, 1 new token (TTFT), after a warm-up of the same shape.
    engine.generate(one(prompt(a.prompt, 2), 1))?;
    let g = engine.generate(one(prompt(a.prompt, 3), 1))?;
    let prefill_tps = a.prompt as f64 / g.time_to_first_token.as_secs_f64();
    println!(
        "ours prefill P={} ttft_ms {:.1} prefill_tok_s {:.0}",
        a.prompt,
        g.time_to_first_token.as_secs_f64() * 1e3,
        prefill_tps
    );
    // Batched prefill: 8 prompts of P tokens in one step (after a warm-up of the same shape).
    for round in 0..2 {
        let t = Instant::now();
        let pending: Vec<_> = (0..8)
            .map(|i| engine.submit(one(prompt(a.prompt, 10 * round + 20 + i), 1)))
            .collect();
        for p in pending {
            p.wait()?;
        }
        if round == 1 {
            let s = t.elapsed().as_secs_f64();
            println!(
                "ours batched_prefill 8xP={} ms {:.1} prefill_tok_s {:.0}",
                a.prompt,
                s * 1e3,
                (8 * a.prompt) as f64 / s
            );
        }
    }

    decode_rows(&engine, &a, "ours")?;
    if a.compare_eager {
        // The same rows with decode steps run eagerly (no CUDA graphs), in this run.
        let eager = ModelRegistry::new(vec![ModelSpec::local("eager", "eager", &dir)])?
            .with_options(EngineOptions {
                cuda_graphs: false,
                ..opts.clone()
            });
        let m = eager.model("eager")?;
        println!(
            "# eager engine: cuda graphs {:?}",
            m.engine().info().cuda_graph_buckets
        );
        decode_rows(m.engine(), &a, "ours-eager")?;
    }

    if a.greedy_check {
        let pending: Vec<_> = (0..8)
            .map(|i| engine.submit(one(prompt(100 + 37 * i, 5000 + i), 24)))
            .collect();
        for (i, p) in pending.into_iter().enumerate() {
            println!("greedy prompt {i}: {:?}", p.wait()?.tokens);
        }
        let l = engine.logits(prompt(64, 7))?;
        let path = std::env::temp_dir().join(format!("policy-serve-logits-ws{}.bin", a.world_size));
        let bytes: Vec<u8> = l.iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&path, bytes)?;
        println!("# logits of 64 positions written to {}", path.display());
    }
    if a.kill_test {
        println!("READY_FOR_KILL");
        let flag = Path::new("/tmp/policy-serve-killed");
        let t = Instant::now();
        while !flag.exists() && t.elapsed().as_secs() < 120 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let t = Instant::now();
        let r = engine.generate(one(prompt(32, 77), 8));
        println!(
            "after kill: {:?} in {:.2}s",
            r.map(|g| g.generated_tokens),
            t.elapsed().as_secs_f64()
        );
        let r = engine.generate(one(prompt(32, 78), 8));
        println!(
            "after kill, next request: {:?}",
            r.map(|g| g.generated_tokens)
        );
        return Ok(());
    }
    if a.world_size > 1 {
        return Ok(());
    }
    // Logits check vs candle-transformers on the same weights.
    let qcfg: qwen3::Config = serde_json::from_value(cfg.clone())?;
    let files = [dir.join("model.safetensors")];
    let check_tokens = prompt(64, 7);
    let ours = engine.logits(check_tokens.clone())?;
    // SAFETY: the file is ours and not modified while mapped.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, &dev)? };
    let embed = vb.get(
        (qcfg.vocab_size, qcfg.hidden_size),
        "model.embed_tokens.weight",
    )?;
    let mut base = qwen3::Model::new(&qcfg, vb.clone())?;
    let input = Tensor::new(check_tokens.as_slice(), &dev)?.unsqueeze(0)?;
    let hidden = base.forward(&input, 0)?.squeeze(0)?;
    let theirs: Vec<Vec<f32>> = hidden
        .matmul(&embed.t()?)?
        .to_dtype(DType::F32)?
        .to_vec2()?;
    let mut max_abs = 0f32;
    let mut scale = 0f32;
    let mut agree = 0;
    for (o, t) in ours.iter().zip(&theirs) {
        for (x, y) in o.iter().zip(t) {
            max_abs = max_abs.max((x - y).abs());
            scale = scale.max(y.abs());
        }
        let am = |v: &Vec<f32>| {
            v.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|x| x.0)
                .unwrap_or(0)
        };
        agree += usize::from(am(o) == am(t));
    }
    println!(
        "check logits vs candle-transformers: max_abs_diff {max_abs:.4} (max |logit| {scale:.2}, rel {:.4}); argmax agree {agree}/{}",
        max_abs / scale.max(1e-6),
        ours.len()
    );
    drop(base);

    if !a.no_peer {
        let mut peer = qwen3::ModelForCausalLM::new(&qcfg, vb)?;
        for &b in &a.batches {
            peer.clear_kv_cache();
            let p: Vec<u32> = (0..b).flat_map(|i| prompt(a.prompt, 1000 + i)).collect();
            let input = Tensor::from_vec(p, (b, a.prompt), &dev)?;
            let logits = peer.forward(&input, 0)?;
            let mut next = logits.squeeze(1)?.argmax(candle_core::D::Minus1)?;
            sync(&dev);
            let t = Instant::now();
            for step in 0..a.new_tokens - 1 {
                let logits = peer.forward(&next.unsqueeze(1)?, a.prompt + step)?;
                next = logits.squeeze(1)?.argmax(candle_core::D::Minus1)?;
            }
            let _ = next.to_vec1::<u32>()?;
            sync(&dev);
            let tps = (b * (a.new_tokens - 1)) as f64 / t.elapsed().as_secs_f64();
            println!("peer candle-transformers decode batch {b}: {tps:.0} tok/s");
        }
    }
    // Free the first engine's KV memory before the agent workload loads its own engines.
    drop(engine);
    drop(model);
    drop(registry);
    if let Some((n, t)) = a.agent {
        for cache in [true, false] {
            agent_workload(&dir, &opts, n, t, cache)?;
        }
    }
    if let Some(keep) = &a.keep {
        std::fs::create_dir_all(keep)?;
        for f in std::fs::read_dir(&dir)? {
            let f = f?;
            std::fs::copy(f.path(), keep.join(f.file_name()))?;
        }
        println!("# model kept in {}", keep.display());
    }
    if owned_dir {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

#[cfg(feature = "nccl")]
fn tp_link(
    a: &Args,
    dev: &Device,
) -> Result<policy_serve::engine::CommHandle, Box<dyn std::error::Error>> {
    let addr = a.rendezvous.ok_or("--world-size > 1 needs --rendezvous")?;
    let comm = policy_serve::engine::parallel::nccl::NcclComm::connect(
        0,
        a.world_size,
        addr,
        dev,
        std::time::Duration::from_secs(300),
    )?;
    Ok(policy_serve::engine::CommHandle(std::sync::Arc::new(comm)))
}

#[cfg(not(feature = "nccl"))]
fn tp_link(
    _: &Args,
    _: &Device,
) -> Result<policy_serve::engine::CommHandle, Box<dyn std::error::Error>> {
    Err("tensor parallelism across processes needs --features nccl".into())
}

/// The NCCL backend in a group of one: all-reduce and all-gather return their input, and a
/// Qwen3 forward through the NCCL all-reduce path equals the plain forward.
#[cfg(feature = "nccl")]
fn nccl_selftest(
    dir: &Path,
    cfg: &serde_json::Value,
    dtype: DType,
    dev: &Device,
) -> Result<(), Box<dyn std::error::Error>> {
    use policy_serve::engine::CommBackend;
    use policy_serve::engine::batch::{LogitRows, SeqInput};
    use policy_serve::engine::model::kv_cache::PagedKvCache;
    let comm = policy_serve::engine::parallel::nccl::NcclComm::connect(
        0,
        1,
        "127.0.0.1:1".parse()?,
        dev,
        std::time::Duration::from_secs(10),
    )?;
    let x = Tensor::randn(0f32, 1.0, (4, 1024), dev)?.to_dtype(dtype)?;
    let r = comm.all_reduce_sum(&x)?;
    let g = comm.all_gather(&x, 1)?;
    let d1 = (r.to_dtype(DType::F32)? - x.to_dtype(DType::F32)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    let d2 = (g.to_dtype(DType::F32)? - x.to_dtype(DType::F32)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    comm.barrier()?;
    let (mcfg, model) = load_bare(dir, cfg, dtype, dev)?;
    let cache = PagedKvCache::new(&mcfg, model.local_kv_heads(), 8, 16, dtype, dev)?;
    let tokens = prompt(100, 3);
    let table: Vec<u32> = (0..8).collect();
    let seqs = [SeqInput {
        q_len: 100,
        context_len: 100,
        block_table: &table,
        logits: LogitRows::All,
    }];
    let plain = model
        .forward(&tokens, &seqs, &cache, None)?
        .ok_or("logits")?;
    let via = model
        .forward(&tokens, &seqs, &cache, Some(&comm))?
        .ok_or("logits")?;
    let d3 = (plain - via)?.abs()?.max_all()?.to_scalar::<f32>()?;
    println!(
        "nccl-selftest world 1: all_reduce max diff {d1}, all_gather max diff {d2}, barrier ok, forward via NCCL vs plain max diff {d3}"
    );
    Ok(())
}

#[cfg(not(feature = "nccl"))]
fn nccl_selftest(
    _: &Path,
    _: &serde_json::Value,
    _: DType,
    _: &Device,
) -> Result<(), Box<dyn std::error::Error>> {
    Err("--nccl-selftest needs --features nccl".into())
}

/// Bare model decode steps (no scheduler, no sampling beyond a device argmax): what the
/// forward itself costs per step at each batch size, to compare with the engine's ms/step.
fn profile_steps(
    dir: &Path,
    cfg: &serde_json::Value,
    dtype: DType,
    dev: &Device,
    a: &Args,
) -> Result<(), Box<dyn std::error::Error>> {
    use policy_serve::engine::batch::{LogitRows, SeqInput};
    use policy_serve::engine::model::kv_cache::PagedKvCache;
    let (mcfg, model) = load_bare(dir, cfg, dtype, dev)?;
    for &b in &a.batches {
        let per_seq = (a.prompt + a.new_tokens).div_ceil(16);
        let cache = PagedKvCache::new(&mcfg, model.local_kv_heads(), b * per_seq, 16, dtype, dev)?;
        let tables: Vec<Vec<u32>> = (0..b)
            .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
            .collect();
        for (i, t) in tables.iter().enumerate() {
            let seqs = [SeqInput {
                q_len: a.prompt,
                context_len: a.prompt,
                block_table: t,
                logits: LogitRows::Last,
            }];
            model.forward(&prompt(a.prompt, i), &seqs, &cache, None)?;
        }
        let steps = 50.min(a.new_tokens);
        let mut ctx = a.prompt;
        let mut tokens: Vec<u32> = vec![1; b];
        let run = |ctx: usize, tokens: &[u32]| -> Result<Vec<u32>, Box<dyn std::error::Error>> {
            let seqs: Vec<SeqInput<'_>> = tables
                .iter()
                .map(|t| SeqInput {
                    q_len: 1,
                    context_len: ctx + 1,
                    block_table: t,
                    logits: LogitRows::Last,
                })
                .collect();
            let l = model
                .forward(tokens, &seqs, &cache, None)?
                .ok_or("logits")?;
            Ok(l.argmax(candle_core::D::Minus1)?.to_vec1::<u32>()?)
        };
        tokens = run(ctx, &tokens)?; // warm-up
        ctx += 1;
        sync(dev);
        let t = Instant::now();
        for _ in 0..steps {
            tokens = run(ctx, &tokens)?;
            ctx += 1;
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
        println!(
            "profile bare decode batch {b}: {ms:.2} ms/step ({:.0} tok/s)",
            b as f64 * 1e3 / ms
        );
    }
    Ok(())
}

/// The dtype choice that resolves to `d`.
fn choice(d: DType) -> DTypeChoice {
    match d {
        DType::BF16 => DTypeChoice::BF16,
        DType::F16 => DTypeChoice::F16,
        _ => DTypeChoice::F32,
    }
}

/// The bench model as a bare `Model` (no engine), for step timing and the NCCL self-test.
fn load_bare(
    dir: &Path,
    cfg: &serde_json::Value,
    dtype: DType,
    dev: &Device,
) -> Result<
    (
        policy_serve::engine::ModelConfig,
        policy_serve::engine::model::Model,
    ),
    Box<dyn std::error::Error>,
> {
    let mcfg = policy_serve::engine::ModelConfig::from_json(&cfg.to_string())?;
    let model = policy_serve::engine::model::loader::load_shard(
        "bench",
        &mcfg,
        &[dir.join("model.safetensors")],
        choice(dtype),
        dev,
        policy_serve::engine::model::shard::Shard::FULL,
        &policy_serve::engine::KernelOptions::default(),
        || {},
    )?;
    Ok((mcfg, model))
}
