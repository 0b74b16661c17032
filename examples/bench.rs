//! Engine benchmark with random weights in a real Qwen3 shape, against stock
//! candle-transformers `qwen3` on the same weights in the same run.
//!
//!     cargo run --release --example bench -- --config tests/fixtures/qwen3/config-0.6b.json
//!     (on the H200: build with --features cuda, see BENCHMARKS.md)
//!
//! Reports: first-forward latency cold (kernel load included) and warm; prefill tok/s; decode
//! tok/s at each batch size (prompt P, N new tokens, greedy, EOS ignored); the same decode
//! figures for candle-transformers; a logits check (ours vs candle-transformers).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::qwen3;
use policy_serve::engine::{DTypeChoice, DeviceChoice, select_device};
use policy_serve::{EngineOptions, GenerationRequest, ModelRegistry, ModelSpec};

struct Args {
    config: PathBuf,
    batches: Vec<usize>,
    prompt: usize,
    new_tokens: usize,
    device: DeviceChoice,
    dtype: DTypeChoice,
    peer: bool,
    layers: Option<usize>,
}

fn args() -> Args {
    let mut a = Args {
        config: "tests/fixtures/qwen3/config-0.6b.json".into(),
        batches: vec![1, 8, 64],
        prompt: 512,
        new_tokens: 128,
        device: DeviceChoice::Auto,
        dtype: DTypeChoice::Auto,
        peer: true,
        layers: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--config" => a.config = val().into(),
            "--batches" => {
                a.batches = val()
                    .split(',')
                    .map(|s| s.parse().expect("batch size"))
                    .collect()
            }
            "--prompt" => a.prompt = val().parse().expect("prompt length"),
            "--new" => a.new_tokens = val().parse().expect("new tokens"),
            "--device" => a.device = val().parse().expect("device"),
            "--dtype" => a.dtype = val().parse().expect("dtype"),
            "--layers" => a.layers = Some(val().parse().expect("layers")),
            "--no-peer" => a.peer = false,
            other => panic!("unknown flag {other}"),
        }
    }
    a
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
    let g = |k: &str| cfg[k].as_u64().unwrap() as usize;
    let (v, h, i, l) = (
        g("vocab_size"),
        g("hidden_size"),
        g("intermediate_size"),
        g("num_hidden_layers"),
    );
    let (nh, nkv, hd) = (
        g("num_attention_heads"),
        g("num_key_value_heads"),
        g("head_dim"),
    );
    let rnd = |shape: (usize, usize)| -> candle_core::Result<Tensor> {
        Tensor::randn(0f32, 0.02, shape, dev)?
            .to_dtype(dtype)?
            .to_device(&Device::Cpu)
    };
    let one = |n: usize| -> candle_core::Result<Tensor> { Tensor::ones(n, dtype, &Device::Cpu) };
    let mut t: HashMap<String, Tensor> = HashMap::new();
    t.insert("model.embed_tokens.weight".into(), (rnd((v, h))? * 50.0)?);
    for li in 0..l {
        let p = format!("model.layers.{li}");
        t.insert(format!("{p}.self_attn.q_proj.weight"), rnd((nh * hd, h))?);
        t.insert(format!("{p}.self_attn.k_proj.weight"), rnd((nkv * hd, h))?);
        t.insert(format!("{p}.self_attn.v_proj.weight"), rnd((nkv * hd, h))?);
        t.insert(format!("{p}.self_attn.o_proj.weight"), rnd((h, nh * hd))?);
        t.insert(format!("{p}.self_attn.q_norm.weight"), one(hd)?);
        t.insert(format!("{p}.self_attn.k_norm.weight"), one(hd)?);
        t.insert(format!("{p}.mlp.gate_proj.weight"), rnd((i, h))?);
        t.insert(format!("{p}.mlp.up_proj.weight"), rnd((i, h))?);
        t.insert(format!("{p}.mlp.down_proj.weight"), rnd((h, i))?);
        t.insert(format!("{p}.input_layernorm.weight"), one(h)?);
        t.insert(format!("{p}.post_attention_layernorm.weight"), one(h)?);
    }
    t.insert("model.norm.weight".into(), one(h)?);
    candle_core::safetensors::save(&t, dir.join("model.safetensors"))
}

fn prompt(n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729) % 150_000) as u32)
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args();
    let dev = select_device(a.device)?;
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&a.config)?)?;
    if let Some(l) = a.layers {
        cfg["num_hidden_layers"] = l.into();
    }
    let dtype = a.dtype.resolve(&dev, Some(DType::BF16));
    let dir = std::env::temp_dir().join(format!("policy-serve-bench-{}", std::process::id()));
    let t0 = Instant::now();
    write_random_model(&dir, &cfg, dtype, &dev)?;
    println!(
        "# random {} weights ({:?}) written in {:.1}s to {}",
        a.config.display(),
        dtype,
        t0.elapsed().as_secs_f64(),
        dir.display()
    );

    let opts = EngineOptions {
        device: a.device,
        dtype: a.dtype,
        max_running: a.batches.iter().copied().max().unwrap_or(1).max(1),
        max_batched_tokens: 8192,
        prefill_chunk: 2048,
        ..EngineOptions::default()
    };
    let registry =
        ModelRegistry::new(vec![ModelSpec::local("bench", "bench", &dir)])?.with_options(opts);
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

    let mut rows = Vec::new();
    for &b in &a.batches {
        // Warm-up at this batch size (kernels for these shapes), then the timed run.
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
            "ours decode batch {b}: {tps:.0} tok/s ({:.2} ms/step; prefill of batch {:.0} ms)",
            decode_s * 1e3 / (a.new_tokens - 1) as f64,
            first.as_secs_f64() * 1e3
        );
        rows.push((b, tps));
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

    if a.peer {
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
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
