//! fp8 (e4m3) KV on the CPU through the public API: logits near full-precision KV's, twice
//! bf16's tokens (four times f32's) in the same memory, the checkpoint's scales applied on
//! write and read (the scale bug class: K/V x4 with scales 4 equals the model with scales 1),
//! calibration at start-up where the checkpoint has none, clear errors for broken scales, and
//! the disk tier never serving one dtype's blocks to an engine of another.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Tensor};
use policy_serve::engine::{KvBudget, KvCacheDtype};
use policy_serve::{Engine, EngineOptions, Error, ModelRegistry, ModelSpec};

use super::tiers::{greedy, pause, temp_dir, tier_options};
use super::{common, max_rel_err, options, reference_logits, registry_with};
use common::prompt;

/// fp8 KV, prompts in chunks of 8: every chunk after the first attends over a prefix read
/// back from the cache (a chunk's own keys and values are attended unrounded).
fn fp8() -> EngineOptions {
    EngineOptions {
        kv_dtype: KvCacheDtype::Fp8,
        prefill_chunk: 8,
        ..options()
    }
}

fn engine_at(dir: PathBuf, opts: EngineOptions) -> Result<(ModelRegistry, Engine), Error> {
    let r = ModelRegistry::new(vec![ModelSpec::local("m", "M", dir)])?.with_options(opts);
    let e = r.model("m")?.engine().clone();
    Ok((r, e))
}

/// The tiny model with `edit` applied to its tensors, written once per test.
fn variant(name: &str, edit: impl FnOnce(&mut HashMap<String, Tensor>)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ps-fp8-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    common::write_model_with(&dir, &common::tiny_config(), 42, edit)
}

/// Multiplies tensor `name` by `by`.
fn scale(t: &mut HashMap<String, Tensor>, name: &str, by: f64) {
    let x = t
        .get(name)
        .unwrap_or_else(|| panic!("{name}"))
        .affine(by, 0.0)
        .unwrap();
    t.insert(name.to_string(), x);
}

/// Per-layer `k_scale` / `v_scale` tensors of `value` (shape `[]`) for the tiny model's 2 layers.
fn add_scales(t: &mut HashMap<String, Tensor>, value: f32) {
    for i in 0..2 {
        for kv in ["k", "v"] {
            t.insert(
                format!("model.layers.{i}.self_attn.{kv}_scale"),
                Tensor::new(value, &candle_core::Device::Cpu).unwrap(),
            );
        }
    }
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
        .0
}

#[test]
fn fp8_kv_logits_stay_near_full_precision_kv_and_hold_four_times_f32s_tokens() {
    let budget = KvBudget {
        cpu_gib: 0.001,
        ..KvBudget::default()
    };
    let r = registry_with(EngineOptions {
        kv_budget: budget,
        ..fp8()
    });
    let engine = r.model("tiny").unwrap().engine().clone();
    assert_eq!(engine.info().kv_dtype, DType::F8E4M3);
    let tokens = prompt(96, 5);
    let ours = engine.logits(tokens.clone()).unwrap();
    let exact = reference_logits(&tokens);
    let err = max_rel_err(&ours, &exact);
    // e4m3 keeps 3 mantissa bits: K and V within 1/16 of their values.
    assert!(err <= 5e-2, "fp8 KV relative error {err}");
    // It is fp8 (a cache silently kept in f32 would be within 1e-4).
    assert!(err > 1e-4, "fp8 KV relative error {err}: is the cache fp8?");
    let agree = ours
        .iter()
        .zip(&exact)
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    assert!(
        agree * 100 >= 95 * ours.len(),
        "argmax agrees on {agree}/{}",
        ours.len()
    );
    // One chunk: every position attends to the chunk's own keys and values unrounded, so the
    // logits are full precision's (a prefill that read the chunk back from the cache fails).
    let one_chunk = registry_with(EngineOptions {
        prefill_chunk: 4096,
        ..fp8()
    });
    let exact_too = one_chunk
        .model("tiny")
        .unwrap()
        .engine()
        .logits(tokens.clone())
        .unwrap();
    let err = max_rel_err(&exact_too, &exact);
    assert!(err <= 1e-4, "one chunk over fp8 KV: relative error {err}");
    // The same budget in blocks: e4m3 is a quarter of f32 and half of bf16.
    let blocks = |kv_dtype| {
        let r = registry_with(EngineOptions {
            kv_budget: budget,
            kv_dtype,
            ..options()
        });
        r.model("tiny").unwrap().engine().info().num_blocks
    };
    let (f32_blocks, fp8_blocks) = (blocks(KvCacheDtype::Auto), engine.info().num_blocks);
    assert_eq!(fp8_blocks, 4 * f32_blocks);
    assert_eq!(fp8_blocks, 2 * blocks(KvCacheDtype::Bf16));
}

#[test]
fn checkpoint_scales_are_applied_on_write_and_read() {
    // K x4 (k_norm), q / 4 (q_norm): the same scores; V x4 (v_proj), o_proj / 4: the same
    // output. Powers of two: every product is exact, and with K/V scales of 4 the cache holds
    // the bytes model A's scales of 1 give it.
    let a = variant("scales-a", |t| add_scales(t, 1.0));
    let b = variant("scales-b", |t| {
        for i in 0..2 {
            let p = format!("model.layers.{i}.self_attn");
            scale(t, &format!("{p}.k_norm.weight"), 4.0);
            scale(t, &format!("{p}.q_norm.weight"), 0.25);
            scale(t, &format!("{p}.v_proj.weight"), 4.0);
            scale(t, &format!("{p}.o_proj.weight"), 0.25);
        }
        add_scales(t, 4.0);
    });
    let tokens = prompt(64, 9);
    let logits = |dir: &PathBuf| {
        engine_at(dir.clone(), fp8())
            .unwrap()
            .1
            .logits(tokens.clone())
    };
    let (la, lb) = (logits(&a).unwrap(), logits(&b).unwrap());
    // A path that ignores the scale on read (or on write) reads B's K and V at a quarter (or
    // four times) their values: scores and outputs change, and this fails.
    let err = max_rel_err(&lb, &la);
    assert!(err <= 1e-5, "scaled model with scales 4 vs scales 1: {err}");
    // Control: the scaled model is another model under a full-precision cache too, the
    // same only up to rounding (its f32 logits differ from A's in the last bits at most).
    let (_, full) = engine_at(b.clone(), options()).unwrap();
    assert!(max_rel_err(&full.logits(tokens.clone()).unwrap(), &la) <= 5e-2);
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);
}

#[test]
fn calibration_fits_scales_to_large_keys_where_scales_of_one_saturate() {
    // Keys x1024 (and q / 1024: the same scores): |K| in the thousands, past e4m3's 448.
    let big = |t: &mut HashMap<String, Tensor>| {
        for i in 0..2 {
            let p = format!("model.layers.{i}.self_attn");
            scale(t, &format!("{p}.k_norm.weight"), 1024.0);
            scale(t, &format!("{p}.q_norm.weight"), 1.0 / 1024.0);
        }
    };
    let calibrated = variant("calib", big);
    let ones = variant("calib-ones", |t| {
        big(t);
        add_scales(t, 1.0);
    });
    let tokens = prompt(64, 4);
    let (_, full) = engine_at(calibrated.clone(), options()).unwrap();
    let exact = full.logits(tokens.clone()).unwrap();
    let (_, e) = engine_at(calibrated.clone(), fp8()).unwrap();
    let err = max_rel_err(&e.logits(tokens.clone()).unwrap(), &exact);
    assert!(err <= 5e-2, "calibrated fp8 KV relative error {err}");
    let (_, e) = engine_at(ones.clone(), fp8()).unwrap();
    let saturated = max_rel_err(&e.logits(tokens).unwrap(), &exact);
    assert!(
        saturated > 4.0 * err.max(1e-3),
        "scales of 1 saturate these keys: {saturated} vs calibrated {err}"
    );
    let _ = std::fs::remove_dir_all(&calibrated);
    let _ = std::fs::remove_dir_all(&ones);
}

#[test]
fn broken_scales_are_start_up_errors_naming_the_tensor() {
    let per_head = variant("bad-shape", |t| {
        add_scales(t, 1.0);
        t.insert(
            "model.layers.1.self_attn.v_scale".into(),
            Tensor::new(&[1f32, 2.0], &candle_core::Device::Cpu).unwrap(),
        );
    });
    let negative = variant("bad-value", |t| {
        add_scales(t, 1.0);
        t.insert(
            "model.layers.0.self_attn.k_scale".into(),
            Tensor::new(-1f32, &candle_core::Device::Cpu).unwrap(),
        );
    });
    let missing = variant("bad-missing", |t| {
        add_scales(t, 1.0);
        t.remove("model.layers.1.self_attn.k_scale");
    });
    for (dir, tensor, says) in [
        (
            &per_head,
            "model.layers.1.self_attn.v_scale",
            "one value per layer",
        ),
        (
            &negative,
            "model.layers.0.self_attn.k_scale",
            "finite and positive",
        ),
        (&missing, "model.layers.1.self_attn.k_scale", "missing"),
    ] {
        let Err(e) = engine_at(dir.clone(), fp8()) else {
            panic!("a broken scale is refused")
        };
        let msg = e.to_string();
        assert!(msg.contains(tensor) && msg.contains(says), "{msg}");
        // The same checkpoint serves with a full-precision cache (the scales are not read).
        assert!(engine_at(dir.clone(), options()).is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn the_disk_tier_never_serves_one_kv_dtypes_blocks_to_another() {
    let dir = temp_dir("fp8-dtype");
    // An engine with an f32 cache leaves a transcript's blocks on disk.
    let next = {
        let r = registry_with(tier_options(1, Some(&dir)));
        let (next, _pin) = pause(r.model("tiny").unwrap().engine());
        next
    };
    // An fp8 engine over the same weights and directory takes none of them.
    let tiered = EngineOptions {
        kv_dtype: KvCacheDtype::Fp8,
        ..tier_options(1, Some(&dir))
    };
    let r = registry_with(tiered);
    let engine = r.model("tiny").unwrap().engine().clone();
    let g = greedy(&engine, next);
    assert_eq!(
        (g.cached_prompt_tokens_disk, g.cached_prompt_tokens),
        (0, 0)
    );
    // Not found at all (keyed by the format), rather than found and refused by length.
    let t = engine.stats().kv_tiers.expect("tiers on");
    assert_eq!(
        (t.disk_loads, t.checksum_failures, t.missing_blocks),
        (0, 0, 0),
        "{t:?}"
    );
    // Its own fp8 blocks go down to host and disk and come back with the answer an fp8
    // engine that never evicted gives.
    let (next, _pin) = pause(&engine);
    let g = greedy(&engine, next.clone());
    assert!(
        g.cached_prompt_tokens_host + g.cached_prompt_tokens_disk > 0,
        "{g:?}"
    );
    let fresh = registry_with(fp8());
    assert_eq!(
        g.tokens,
        greedy(fresh.model("tiny").unwrap().engine(), next).tokens
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fp8_blocks_swap_out_and_back_with_the_answers_of_a_pool_that_never_preempts() {
    let (free, _) = super::limits::six_at_once(fp8());
    let (tight, stats) = super::limits::six_at_once(EngineOptions {
        kv_budget: KvBudget {
            blocks: Some(10),
            ..KvBudget::default()
        },
        prefix_cache: false,
        kv_host_gib: 1.0,
        ..fp8()
    });
    assert!(stats.swap_outs > 0, "{stats:?}");
    assert_eq!(stats.swap_ins, stats.swap_outs);
    assert_eq!(free, tight);
}
