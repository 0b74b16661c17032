//! LoRA adapters over one base (`Engine::load_adapter`, `GenerationRequest::adapter`): an
//! adapter written as PEFT writes it equals the merged weights W + s·B·A, a mixed batch equals
//! each request alone, adapters never share cached prefixes, more adapters than device slots
//! take turns, and every adapter the engine could not serve exactly is refused by name.

use super::*;
use policy_serve::engine::{AdapterHandle, Engine, LoraOptions};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Every projection a Qwen3 adapter may target: (parent module, name, in, out) in the tiny
/// model (hidden 32, 4 heads and 2 KV heads of 16, intermediate 64).
const PROJS: [(&str, &str, usize, usize); 7] = [
    ("self_attn", "q_proj", 32, 64),
    ("self_attn", "k_proj", 32, 32),
    ("self_attn", "v_proj", 32, 32),
    ("self_attn", "o_proj", 64, 32),
    ("mlp", "gate_proj", 32, 64),
    ("mlp", "up_proj", 32, 64),
    ("mlp", "down_proj", 64, 32),
];

pub(super) fn lora_options(max_loras: usize) -> EngineOptions {
    EngineOptions {
        lora: Some(LoraOptions {
            max_loras,
            max_lora_rank: 8,
        }),
        ..options()
    }
}

pub(super) fn random(n: usize, seed: u64, std: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f32 / (1u64 << 53) as f32 - 0.5) * 2.0 * std * 1.7
        })
        .collect()
}

/// What an adapter written by [`write_adapter`] holds.
pub(super) struct Spec<'a> {
    pub(super) seed: u64,
    pub(super) rank: usize,
    pub(super) alpha: f64,
    pub(super) targets: &'a [&'a str],
    pub(super) rslora: bool,
    /// Tensor names with the PEFT prefix `base_model.model.` (both forms occur).
    pub(super) prefixed: bool,
}

impl Default for Spec<'_> {
    fn default() -> Self {
        Self {
            seed: 1,
            rank: 4,
            alpha: 8.0,
            targets: &[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],
            rslora: false,
            prefixed: true,
        }
    }
}

/// The adapter's tensors by name: lora_A `[r, in]` and lora_B `[out, r]` per targeted
/// projection of both layers.
pub(super) fn adapter_tensors(s: &Spec<'_>) -> HashMap<String, Tensor> {
    let mut out = HashMap::new();
    let prefix = if s.prefixed { "base_model.model." } else { "" };
    for layer in 0..2 {
        for (i, (parent, name, fan_in, fan_out)) in PROJS.iter().enumerate() {
            if !s.targets.contains(name) {
                continue;
            }
            let seed = s.seed * 1000 + layer as u64 * 10 + i as u64;
            let base = format!("{prefix}model.layers.{layer}.{parent}.{name}");
            let a = random(s.rank * fan_in, seed, 1.0 / (*fan_in as f32).sqrt());
            let b = random(fan_out * s.rank, seed + 500, 0.3);
            out.insert(
                format!("{base}.lora_A.weight"),
                Tensor::from_vec(a, (s.rank, *fan_in), &Device::Cpu).unwrap(),
            );
            out.insert(
                format!("{base}.lora_B.weight"),
                Tensor::from_vec(b, (*fan_out, s.rank), &Device::Cpu).unwrap(),
            );
        }
    }
    out
}

pub(super) fn adapter_config(s: &Spec<'_>) -> Value {
    json!({
        "peft_type": "LORA",
        "base_model_name_or_path": "tiny",
        "r": s.rank,
        "lora_alpha": s.alpha,
        "target_modules": s.targets,
        "use_rslora": s.rslora,
        "use_dora": false,
        "bias": "none",
        "fan_in_fan_out": false,
        "modules_to_save": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "lora_dropout": 0.05,
        "task_type": "CAUSAL_LM"
    })
}

/// Writes a PEFT adapter directory (config edited by `edit`, tensors by `tensors`).
pub(super) fn write_adapter_with(
    s: &Spec<'_>,
    edit: impl FnOnce(&mut Value),
    tensors: impl FnOnce(&mut HashMap<String, Tensor>),
) -> PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    let mut cfg = adapter_config(s);
    edit(&mut cfg);
    std::fs::write(dir.join("adapter_config.json"), cfg.to_string()).unwrap();
    let mut t = adapter_tensors(s);
    tensors(&mut t);
    candle_core::safetensors::save(&t, dir.join("adapter_model.safetensors")).unwrap();
    dir
}

pub(super) fn write_adapter(s: &Spec<'_>) -> PathBuf {
    write_adapter_with(s, |_| {}, |_| {})
}

/// A model directory whose weights are the shared tiny model's with the adapter merged in
/// (W + s·B·A, computed here in f32).
fn merged_model(s: &Spec<'_>) -> PathBuf {
    let dir = common::tiny_model_copy();
    let mut weights =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let scale = if s.rslora {
        s.alpha / (s.rank as f64).sqrt()
    } else {
        s.alpha / s.rank as f64
    };
    for (name, a) in adapter_tensors(s) {
        let Some(base) = name.strip_suffix(".lora_A.weight") else {
            continue;
        };
        let b = &adapter_tensors(s)[&format!("{base}.lora_B.weight")];
        let key = format!("{}.weight", base.trim_start_matches("base_model.model."));
        let w = &weights[&key];
        let merged = (w + (b.matmul(&a).unwrap() * scale).unwrap()).unwrap();
        weights.insert(key, merged);
    }
    candle_core::safetensors::save(&weights, dir.join("model.safetensors")).unwrap();
    dir
}

pub(super) fn engine_on(dir: &Path, opts: EngineOptions) -> (ModelRegistry, Engine) {
    let r = ModelRegistry::new(vec![ModelSpec::local("tiny", "Tiny", dir.to_path_buf())])
        .unwrap()
        .with_options(opts);
    let e = r.model("tiny").unwrap().engine().clone();
    (r, e)
}

fn greedy_on(engine: &Engine, adapter: Option<&AdapterHandle>, salt: u32) -> Vec<u32> {
    let mut req = GenerationRequest::new(prompt(20, salt)).max_new_tokens(10);
    req.ignore_eos = true;
    req.adapter = adapter.cloned();
    engine.generate(req).unwrap().tokens
}

/// The engine with an adapter equals the engine on merged weights: logits within 1e-5 and
/// the same greedy tokens, for an adapter on all seven projections (names with the PEFT
/// prefix) and an rsLoRA one on q/v only (names without it). Mutations that fail it: the
/// scale left out of B (or alpha/r where rsLoRA says alpha/sqrt(r)), k's delta written into
/// v's rows of the fused qkv output, gate's and up's rank blocks swapped, the delta of o_proj
/// computed from the normed input instead of the attention output.
#[test]
fn an_adapter_equals_its_merged_weights() {
    let (_r, engine) = engine_on(&common::shared_tiny_model(), lora_options(4));
    let tokens = prompt(30, 700);
    let base = engine.logits(tokens.clone()).unwrap();
    for spec in [
        Spec::default(),
        Spec {
            seed: 2,
            rank: 8,
            alpha: 16.0,
            targets: &["q_proj", "v_proj"],
            rslora: true,
            prefixed: false,
        },
    ] {
        let h = engine.load_adapter("a", &write_adapter(&spec)).unwrap();
        let got = engine.logits_with(tokens.clone(), Some(&h)).unwrap();
        let (_m, merged) = engine_on(&merged_model(&spec), options());
        let want = merged.logits(tokens.clone()).unwrap();
        // f32 sums in another order (W x + s B (A x) vs (W + s B A) x): relative to each
        // row's largest logit.
        let err = max_rel_err(&got, &want);
        assert!(err <= 1e-5, "adapter vs merged: relative error {err}");
        assert!(
            max_diff(&got, &base) > 1e-2,
            "positive control: the adapter changes the logits"
        );
        assert_eq!(
            greedy_on(&engine, Some(&h), 701),
            greedy_on(&merged, None, 701)
        );
    }
    assert_eq!(
        engine.logits(tokens).unwrap(),
        base,
        "the base is untouched by its adapters"
    );
}

/// Three adapters and the base in one batch: every request gets the tokens it gets alone.
/// Mutations that fail it: a segment's slot taken from the wrong sequence, deltas added to
/// base rows (slot `None` treated as 0).
#[test]
fn a_mixed_batch_equals_each_request_alone() {
    let (_r, engine) = engine_on(&common::shared_tiny_model(), lora_options(4));
    let handles: Vec<Option<AdapterHandle>> = std::iter::once(None)
        .chain((0..3).map(|i| {
            let spec = Spec {
                seed: 10 + i,
                ..Spec::default()
            };
            Some(
                engine
                    .load_adapter(&format!("a{i}"), &write_adapter(&spec))
                    .unwrap(),
            )
        }))
        .collect();
    let jobs: Vec<(Option<AdapterHandle>, u32)> = (0..12)
        .map(|i| (handles[i % 4].clone(), 800 + i as u32))
        .collect();
    let alone: Vec<Vec<u32>> = jobs
        .iter()
        .map(|(h, salt)| greedy_on(&engine, h.as_ref(), *salt))
        .collect();
    let pending: Vec<_> = jobs
        .iter()
        .map(|(h, salt)| {
            let mut req = GenerationRequest::new(prompt(20, *salt)).max_new_tokens(10);
            req.ignore_eos = true;
            req.adapter = h.clone();
            engine.submit(req)
        })
        .collect();
    let batched: Vec<Vec<u32>> = pending
        .into_iter()
        .map(|p| p.wait().unwrap().tokens)
        .collect();
    assert_eq!(batched, alone);
    assert_ne!(
        alone[0], alone[1],
        "positive control: adapters answer differently"
    );
    // The versions say which weights produced each answer.
    let g = engine
        .generate({
            let mut r = GenerationRequest::new(prompt(8, 1)).max_new_tokens(1);
            r.adapter = handles[2].clone();
            r
        })
        .unwrap();
    let v = g.weights_version.adapter.unwrap();
    assert_eq!((v.name.as_str(), v.version), ("a1", 1));
}

/// The same prompt under two adapters and the base: none reuses another's cached prefix;
/// each reuses its own. Mutation: one namespace for all (the second adapter's answer would
/// be computed over the first one's KV).
#[test]
fn adapters_never_share_cached_prefixes() {
    let (_r, engine) = engine_on(&common::shared_tiny_model(), lora_options(4));
    let a = engine
        .load_adapter("a", &write_adapter(&Spec::default()))
        .unwrap();
    let b = engine
        .load_adapter(
            "b",
            &write_adapter(&Spec {
                seed: 5,
                ..Spec::default()
            }),
        )
        .unwrap();
    let run = |h: Option<&AdapterHandle>| {
        let mut req = GenerationRequest::new(prompt(80, 900)).max_new_tokens(4);
        req.adapter = h.cloned();
        engine.generate(req).unwrap()
    };
    assert_eq!(run(Some(&a)).cached_prompt_tokens, 0);
    let on_b = run(Some(&b));
    assert_eq!(on_b.cached_prompt_tokens, 0, "b reused a's prefix");
    assert_eq!(
        run(None).cached_prompt_tokens,
        0,
        "the base reused an adapter's prefix"
    );
    assert!(
        run(Some(&a)).cached_prompt_tokens >= 64,
        "a reuses its own prefix"
    );
    // b's answer over its own cache equals b's answer computed fresh.
    let again = run(Some(&b));
    assert!(again.cached_prompt_tokens >= 64);
    assert_eq!(again.tokens, on_b.tokens);
}

/// Five adapters over two device slots, all requested at once: every request finishes with
/// the tokens it gets alone (adapters move in and out least recently used first).
#[test]
fn more_adapters_than_slots_take_turns() {
    let (_r, engine) = engine_on(&common::shared_tiny_model(), lora_options(2));
    let handles: Vec<AdapterHandle> = (0..5)
        .map(|i| {
            let spec = Spec {
                seed: 20 + i,
                ..Spec::default()
            };
            engine
                .load_adapter(&format!("a{i}"), &write_adapter(&spec))
                .unwrap()
        })
        .collect();
    let alone: Vec<Vec<u32>> = handles
        .iter()
        .enumerate()
        .map(|(i, h)| greedy_on(&engine, Some(h), 950 + i as u32))
        .collect();
    let loads = engine.stats().adapter_loads;
    assert!(loads >= 5, "each adapter moved in ({loads})");
    let pending: Vec<_> = handles
        .iter()
        .enumerate()
        .flat_map(|(i, h)| {
            (0..2).map(move |_| {
                let mut req = GenerationRequest::new(prompt(20, 950 + i as u32)).max_new_tokens(10);
                req.ignore_eos = true;
                req.adapter = Some(h.clone());
                (i, req)
            })
        })
        .map(|(i, req)| (i, engine.submit(req)))
        .collect();
    for (i, p) in pending {
        assert_eq!(p.wait().unwrap().tokens, alone[i]);
    }
}

/// A retired adapter version: requests that started on it finish on it, requests after it
/// run on the newest version of its name.
#[test]
fn a_new_adapter_version_takes_new_requests_and_the_old_one_drains() {
    let (_r, engine) = engine_on(&common::shared_tiny_model(), lora_options(4));
    let v1 = engine
        .load_adapter("a", &write_adapter(&Spec::default()))
        .unwrap();
    let want_v1 = greedy_on(&engine, Some(&v1), 990);
    let mut long = GenerationRequest::new(prompt(20, 990)).max_new_tokens(10);
    long.ignore_eos = true;
    long.adapter = Some(v1.clone());
    let (running, mut stream) = engine.submit_streaming(long);
    // Started on v1 before the new version arrives: its first text is out (a request still
    // waiting when v1 retires would rightly start on v2).
    let _ = stream.next_blocking();
    let spec2 = Spec {
        seed: 77,
        ..Spec::default()
    };
    let v2 = engine.load_adapter("a", &write_adapter(&spec2)).unwrap();
    assert_eq!(v2.version().version, 2);
    assert_ne!(v1.version().digest, v2.version().digest);
    engine.retire_adapter(&v1, true).wait().unwrap();
    let g = running.wait().unwrap();
    assert_eq!(g.tokens, want_v1, "the running request finished on v1");
    // A request naming v1 now runs on v2.
    let after = greedy_on(&engine, Some(&v1), 990);
    assert_eq!(after, greedy_on(&engine, Some(&v2), 990));
    assert_ne!(after, want_v1);
}

/// The wide layout (`KernelOptions::lora_wide`: each fused weight and its slots' `a` in one
/// buffer, the layer's weight a view of its first rows) serves on the candle path exactly
/// what separate buffers serve: an adapter written into its slot through the `a` view, the
/// base through the weight view, and new base weights written in place through it while the
/// adapter stays in its slot. Mutations that fail it: the `a` view starting a row early
/// (inside the base rows) or the weight view reaching into the tail; an update that writes a
/// fresh tensor instead of into the view (the layer would lose its wide buffer's rows).
#[test]
fn the_wide_layout_serves_what_separate_buffers_serve() {
    let wide_opts = EngineOptions {
        kernels: policy_serve::engine::KernelOptions {
            lora_wide: Some(1),
            ..Default::default()
        },
        ..lora_options(4)
    };
    let (_r, wide) = engine_on(&common::shared_tiny_model(), wide_opts);
    let plain_opts = EngineOptions {
        kernels: policy_serve::engine::KernelOptions {
            lora_wide: None,
            ..Default::default()
        },
        ..lora_options(4)
    };
    let (_p, plain) = engine_on(&common::shared_tiny_model(), plain_opts.clone());
    let dir = write_adapter(&Spec::default());
    let hw = wide.load_adapter("a", &dir).unwrap();
    let hp = plain.load_adapter("a", &dir).unwrap();
    let tokens = prompt(30, 710);
    let with = |e: &Engine, h: &AdapterHandle| e.logits_with(tokens.clone(), Some(h)).unwrap();
    assert_eq!(with(&wide, &hw), with(&plain, &hp));
    assert_eq!(
        wide.logits(tokens.clone()).unwrap(),
        plain.logits(tokens.clone()).unwrap()
    );
    assert_eq!(
        greedy_on(&wide, Some(&hw), 711),
        greedy_on(&plain, Some(&hp), 711)
    );
    let b = common::cached_model("tiny-v1-seed7", &common::tiny_config(), 7);
    wide.update_weights(policy_serve::engine::WeightSource::Dir(b.clone()), true)
        .wait()
        .unwrap();
    let (_q, fresh) = engine_on(&b, plain_opts);
    let hf = fresh.load_adapter("a", &dir).unwrap();
    assert_eq!(with(&wide, &hw), with(&fresh, &hf));
    assert!(
        max_diff(&with(&fresh, &hf), &with(&plain, &hp)) > 1e-2,
        "positive control: the new base answers differently"
    );
}
