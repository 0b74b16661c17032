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

mod agent;
mod args;
mod bare;
mod lora;
mod mixed;
mod rows;
mod spec;
mod tiers;
mod variants;

use agent::agent_workload;
use args::Args;
use bare::{nccl_selftest, profile_steps, tp_link};
use mixed::mixed_latency;
use rows::decode_rows;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::qwen3;
use clap::Parser;
use policy_serve::engine::{DTypeChoice, select_device};
use policy_serve::testing::{TensorRole, qwen3_tensor_specs};
use policy_serve::{EngineOptions, GenerationRequest, ModelRegistry, ModelSpec};

/// An engine on the model in `dir` under `opts`, with the registry that owns its weights: keep
/// both while the engine runs, drop both before the next engine sizes its KV pool.
pub(crate) fn engine_on(
    dir: &Path,
    opts: EngineOptions,
) -> Result<(ModelRegistry, policy_serve::Engine), Box<dyn std::error::Error>> {
    let registry =
        ModelRegistry::new(vec![ModelSpec::local("bench", "bench", dir)])?.with_options(opts);
    let engine = registry.model("bench")?.engine().clone();
    Ok((registry, engine))
}

fn sync(dev: &Device) {
    dev.synchronize().expect("synchronize");
}

/// Writes config.json, tokenizer files and random weights (std 0.02, norms 1) to `dir`: one
/// `model.safetensors`, or past `shard_bytes` shards of about that size with a
/// `model.safetensors.index.json` (the Hugging Face layout of large checkpoints), so that the
/// writer holds one shard in memory, not the model (the 48-layer 30B-A3B shape is ~61 GB).
fn write_random_model(
    dir: &Path,
    cfg: &serde_json::Value,
    (dtype, shard_bytes): (DType, usize),
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
    let specs = qwen3_tensor_specs(&mcfg);
    let total: usize = specs
        .iter()
        .map(|s| s.shape.iter().product::<usize>())
        .sum::<usize>()
        * dtype.size_in_bytes();
    let sharded = total > shard_bytes;
    let mut t: HashMap<String, Tensor> = HashMap::new();
    let (mut held, mut shard) = (0usize, 0usize);
    let mut weight_map = serde_json::Map::new();
    let mut flush =
        |t: &mut HashMap<String, Tensor>, shard: &mut usize| -> candle_core::Result<()> {
            *shard += 1;
            let name = format!("model-{shard:05}.safetensors");
            for k in t.keys() {
                weight_map.insert(k.clone(), name.clone().into());
            }
            candle_core::safetensors::save(t, dir.join(&name))?;
            t.clear();
            Ok(())
        };
    for spec in specs {
        let tensor = match spec.role {
            TensorRole::Embedding => {
                (Tensor::randn(0f32, 0.02, spec.shape, dev)? * (h as f64).sqrt())?
            }
            TensorRole::Matrix => Tensor::randn(0f32, 0.02, spec.shape, dev)?,
            TensorRole::Norm => Tensor::ones(spec.shape, DType::F32, dev)?,
        };
        held += tensor.elem_count() * dtype.size_in_bytes();
        t.insert(spec.name, tensor.to_dtype(dtype)?.to_device(&Device::Cpu)?);
        if sharded && held >= shard_bytes {
            flush(&mut t, &mut shard)?;
            held = 0;
        }
    }
    if !sharded {
        return candle_core::safetensors::save(&t, dir.join("model.safetensors"));
    }
    if !t.is_empty() {
        flush(&mut t, &mut shard)?;
    }
    let index = serde_json::json!({
        "metadata": { "total_size": total },
        "weight_map": weight_map,
    });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string())?;
    Ok(())
}

fn prompt(n: usize, salt: usize) -> Vec<u32> {
    policy_serve::testing::synthetic_prompt(n, salt)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    policy_serve::init_logging("warn");
    let a = Args::parse();
    let variants = variants::parse_variants(&a)?;
    let dev = select_device(a.device)?;
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&a.config)?)?;
    if let Some(l) = a.layers {
        cfg["num_hidden_layers"] = l.into();
    }
    let dtype = a.dtype.resolve(&dev, Some(DType::BF16));
    let write = |dir: &Path| -> Result<(), Box<dyn std::error::Error>> {
        let t0 = Instant::now();
        write_random_model(dir, &cfg, (dtype, a.shard_mib.max(1) << 20), &dev)?;
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
        max_running: Some(a.batches.iter().copied().max().unwrap_or(1).max(1)),
        max_batched_tokens: a.max_batched_tokens,
        prefill_chunk: a.prefill_chunk,
        pipelined_decode: !a.no_pipelined_decode,
        max_graph_batch: a.max_graph_batch,
        profile_steps: (a.profile_steps > 0).then_some(a.profile_steps),
        grammar_mask_parts: a.grammar_mask_parts,
        grammar_bounded_strings: !a.no_grammar_bounded_strings,
        grammar_fast_forward: a.grammar_fast_forward,
        grammar_fast_forward_max_batch: a.grammar_fast_forward_max_batch,
        kernels: a.kernels.options(),
        // Plain decode: speculation (on by default) is measured by `--spec-ks`; forced tokens
        // fast-forwarded ride on it, so `--grammar-fast-forward` keeps it at its default.
        speculative: if a.grammar_fast_forward {
            EngineOptions::default().speculative
        } else {
            None
        },
        kv_host_gib: a.kv_host_gib,
        kv_dtype: a.kv_cache_dtype,
        ..EngineOptions::default()
    };
    if a.adapters > 0 {
        opts.lora = Some(policy_serve::engine::LoraOptions {
            max_loras: a.adapters,
            max_lora_rank: a.adapter_rank,
        });
    }
    if a.world_size > 1 {
        opts.tensor_parallel = Some(tp_link(&a, &dev)?);
        opts.tp_graphs = a.tp_graphs;
        println!(
            "# tensor-parallel: rank 0 of {} (graphs on every rank: {})",
            a.world_size, a.tp_graphs
        );
    }
    if !a.spec_ks.is_empty() {
        spec::spec_sweep(&dir, &opts, &a)?;
        if owned_dir {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return Ok(());
    }
    if !variants.is_empty() {
        variants::variant_sweep(&dir, &opts, &a, &variants)?;
        if owned_dir {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return Ok(());
    }
    if !a.tiers_resume.is_empty() {
        tiers::tiers_resume(&dir, &opts, &cfg, &a.tiers_resume)?;
        if owned_dir {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return Ok(());
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

    if a.mixed {
        mixed_latency(&engine, a.prompt, a.prefill_chunk)?;
    }
    decode_rows(&engine, &a, "ours", &|_, _| {})?;
    if a.adapters > 0 {
        lora::adapter_rows(&engine, &a, &cfg)?;
    }
    if a.constrained {
        let tools = policy_serve::ToolDefinition::list_from_json(&std::fs::read_to_string(
            "tests/fixtures/tools/nested.json",
        )?)?;
        let t = Instant::now();
        let grammar = policy_serve::OutputConstraint::tools(policy_serve::ToolChoice::Required)
            .compile(engine.grammar_compiler()?, &tools, false)?;
        println!(
            "# grammar compiler + three-tool grammar ready in {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        // This host's time per mask per row: walks along a call (mask, then its token), one
        // after another as requests follow each other (a finished matcher goes back to the
        // grammar, rewound); masks whole (the CPU time a row costs) and split in parts (what
        // a row waits when threads are free), with the slowest mask of the walks.
        // The second call fills a maxLength-10 string (where rows with random weights spend
        // most of their steps).
        let calls = [
            (
                "call",
                "<tool_call>\n{\"name\": \"update\", \"arguments\": {\"id\": 4211, \"fields\": {\"name\": \"ana\", \"active\": true}}}\n</tool_call>",
            ),
            (
                "filled-string call",
                "<tool_call>\n{\"name\": \"answer\", \"arguments\": {\"value\": \"caf\u{e9} 12 ab\", \"score\": 3}}\n</tool_call>",
            ),
        ];
        let walks = 200;
        for (what, call) in calls {
            let ids = engine.tokenize(call)?;
            for (label, may_split) in [("whole", false), ("split", true)] {
                let (mut total, mut slowest) = (Duration::ZERO, Duration::ZERO);
                let (mut start, mut end) = (Duration::ZERO, Duration::ZERO);
                for _ in 0..walks {
                    let t = Instant::now();
                    let mut m = grammar.matcher();
                    start += t.elapsed();
                    for &tok in &ids {
                        let t = Instant::now();
                        std::hint::black_box(m.mask_with(may_split)?);
                        m.consume(tok)?;
                        total += t.elapsed();
                        slowest = slowest.max(t.elapsed());
                    }
                    // Given back to the grammar (rewound), as a finished request's is.
                    let t = Instant::now();
                    drop(m);
                    end += t.elapsed();
                }
                println!(
                    "constrained mask+consume per row, {label}: {:.1} us (mean of {walks} walks over a {}-token {what}; slowest {:.0} us; {} parts; bounded strings {}; a matcher's start {:.1} us, give-back {:.1} us)",
                    total.as_secs_f64() * 1e6 / (walks * ids.len()) as f64,
                    ids.len(),
                    slowest.as_secs_f64() * 1e6,
                    engine.grammar_compiler()?.mask_parts(),
                    !a.no_grammar_bounded_strings,
                    start.as_secs_f64() * 1e6 / walks as f64,
                    end.as_secs_f64() * 1e6 / walks as f64,
                );
            }
        }
        decode_rows(&engine, &a, "constrained", &|r, _| {
            r.grammar = Some(grammar.clone())
        })?;
    }
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
        decode_rows(m.engine(), &a, "ours-eager", &|_, _| {})?;
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
            std::thread::sleep(Duration::from_millis(100));
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
    if cfg["model_type"] == "qwen3_moe" {
        println!(
            "# no candle-transformers peer for qwen3_moe (scripts/hf_logits_check.py checks it)"
        );
        return Ok(());
    }
    // Logits check vs candle-transformers on the same weights.
    let qcfg: qwen3::Config = serde_json::from_value(cfg.clone())?;
    let files = policy_serve::engine::model::files::safetensors_in(&dir)?;
    let check_tokens = prompt(64, 7);
    let ours = engine.logits(check_tokens.clone())?;
    // SAFETY: the files are ours and not modified while mapped.
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
