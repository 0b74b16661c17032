//! Qwen3-MoE on the CPU: a tiny mixture-of-experts checkpoint in the HF layout (8 experts,
//! top-2, a dense layer among sparse ones) against a float64 reference of transformers' math
//! written here; expert parallelism over the in-process backend equals one rank; bad
//! checkpoints and settings are refused naming the tensor or the setting.

#[path = "../common/mod.rs"]
mod common;
mod reference;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use reference::{Reference, argmax};
use std::sync::Arc;
use std::time::Duration;

use candle_core::Tensor;
use common::prompt;
use policy_serve::engine::{CommHandle, DeviceChoice, InProcessComm, WorkerCommand, WorkerOptions};
use policy_serve::{EngineOptions, GenerationRequest, ModelRegistry, ModelSpec};
use serde_json::Value;

/// A tiny Qwen3-MoE config: 3 layers, layer 1 dense (`mlp_only_layers`), 8 experts, top-2;
/// head counts and the expert count divide by 4.
fn moe_config(norm_topk: bool) -> Value {
    let mut cfg = common::tiny_config();
    cfg["architectures"] = serde_json::json!(["Qwen3MoeForCausalLM"]);
    cfg["model_type"] = "qwen3_moe".into();
    cfg["num_hidden_layers"] = 3.into();
    cfg["num_attention_heads"] = 8.into();
    cfg["num_key_value_heads"] = 4.into();
    cfg["head_dim"] = 8.into();
    cfg["num_experts"] = 8.into();
    cfg["num_experts_per_tok"] = 2.into();
    cfg["moe_intermediate_size"] = 16.into();
    cfg["decoder_sparse_step"] = 1.into();
    cfg["mlp_only_layers"] = serde_json::json!([1]);
    cfg["norm_topk_prob"] = norm_topk.into();
    cfg
}

fn moe_model(norm_topk: bool) -> PathBuf {
    static DIRS: std::sync::OnceLock<[PathBuf; 2]> = std::sync::OnceLock::new();
    DIRS.get_or_init(|| {
        [false, true].map(|n| common::cached_model(&format!("moe-v1-n{n}"), &moe_config(n), 11))
    })[usize::from(norm_topk)]
    .clone()
}

fn options() -> EngineOptions {
    EngineOptions {
        device: DeviceChoice::Cpu,
        worker_timeout: Duration::from_secs(20),
        ..EngineOptions::default()
    }
}

fn registry(dir: &Path, opts: EngineOptions) -> ModelRegistry {
    ModelRegistry::new(vec![ModelSpec::local("moe", "MoE", dir)])
        .unwrap()
        .with_options(opts)
}

fn rel_err(ours: &[Vec<f32>], theirs: &[Vec<f64>]) -> f64 {
    let mut worst = 0f64;
    for (a, b) in ours.iter().zip(theirs) {
        let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((*x as f64 - y).abs() / scale);
        }
    }
    worst
}

/// Fails if the router's top-k weights are not renormalized when `norm_topk_prob` says so
/// (or are when it does not), if `mlp_only_layers` is ignored (layer 1 would look for
/// experts and fail to load), if experts' outputs are not weighted, or ties/orders differ.
#[test]
fn logits_equal_a_float64_reference_of_the_hf_math_for_both_norm_topk_prob_values() {
    let tokens = prompt(29, 4);
    let mut errs = Vec::new();
    for norm in [false, true] {
        let dir = moe_model(norm);
        let r = registry(&dir, options());
        let engine = r.model("moe").unwrap().engine().clone();
        let ours = engine.logits(tokens.clone()).unwrap();
        let theirs = Reference::load(&dir).logits(&tokens);
        let err = rel_err(&ours, &theirs);
        assert!(err <= 1e-4, "norm_topk_prob {norm}: relative error {err}");
        errs.push((ours, theirs));
    }
    // Positive control: the two settings route to different outputs, and each engine's
    // logits are far from the other setting's reference.
    assert!(rel_err(&errs[0].0, &errs[1].1) > 1e-3);
}

#[test]
fn greedy_tokens_through_the_engine_equal_the_references() {
    let dir = moe_model(true);
    let reference = Reference::load(&dir);
    let r = registry(&dir, options());
    let engine = r.model("moe").unwrap().engine().clone();
    for salt in [1u32, 2] {
        let p = prompt(9 + salt as usize, salt);
        let g = engine
            .generate(GenerationRequest::new(p.clone()).max_new_tokens(8))
            .unwrap();
        let mut seq = p.clone();
        let mut want = Vec::new();
        for _ in 0..g.tokens.len() {
            let next = argmax(reference.logits(&seq).last().unwrap());
            want.push(next);
            seq.push(next);
        }
        assert_eq!(g.tokens, want, "prompt salt {salt}");
        assert_eq!(g.tokens.len(), 8);
    }
}

// ---- expert parallelism over the in-process backend ----

struct Group {
    registry: ModelRegistry,
    workers: common::Workers,
}

fn ep_group(world: usize, worker: impl Fn(usize) -> WorkerOptions) -> Group {
    let dir = moe_model(false);
    let (head, workers) = common::in_process_group(&dir, world, worker);
    let opts = EngineOptions {
        tensor_parallel: Some(CommHandle(head)),
        expert_parallel: true,
        ..options()
    };
    Group {
        registry: registry(&dir, opts),
        workers,
    }
}

fn ep_worker(_: usize) -> WorkerOptions {
    WorkerOptions {
        engine: EngineOptions {
            expert_parallel: true,
            ..options()
        },
        fail_command: None,
    }
}

fn run_all(r: &ModelRegistry) -> (Vec<Vec<f32>>, Vec<Vec<u32>>) {
    let engine = r.model("moe").unwrap().engine().clone();
    let logits = engine.logits(prompt(17, 3)).unwrap();
    let pending: Vec<_> = (0..4)
        .map(|i| {
            engine
                .submit(GenerationRequest::new(prompt(4 + 5 * i, 20 + i as u32)).max_new_tokens(10))
        })
        .collect();
    let tokens = pending
        .into_iter()
        .map(|p| p.wait().unwrap().tokens)
        .collect();
    (logits, tokens)
}

/// Fails if a rank's experts are not the ones it is routed (e.g. every rank taking its
/// experts' ids from 0: checked, the tokens differ at world 2).
#[test]
fn expert_parallel_worlds_2_and_4_equal_one_rank_token_for_token() {
    let (ref_logits, ref_tokens) = run_all(&registry(&moe_model(false), options()));
    for world in [2, 4] {
        let g = ep_group(world, ep_worker);
        let (logits, tokens) = run_all(&g.registry);
        assert_eq!(tokens, ref_tokens, "EP world {world}");
        let theirs: Vec<Vec<f64>> = ref_logits
            .iter()
            .map(|r| r.iter().map(|&v| v as f64).collect())
            .collect();
        let err = rel_err(&logits, &theirs);
        assert!(err <= 1e-4, "EP world {world}: relative error {err}");
        drop(g.registry);
        for w in g.workers {
            let report = w.join().unwrap().unwrap();
            assert!(report.clean_shutdown && report.commands > 0, "{report:?}");
        }
    }
    // Tensor-parallel experts (each expert sliced) agree too.
    let dir = moe_model(false);
    let (head, workers) = common::in_process_group(&dir, 2, |_| WorkerOptions {
        engine: options(),
        fail_command: None,
    });
    let tp = registry(
        &dir,
        EngineOptions {
            tensor_parallel: Some(CommHandle(head)),
            ..options()
        },
    );
    assert_eq!(run_all(&tp).1, ref_tokens, "TP world 2 over sliced experts");
    drop(tp);
    for w in workers {
        assert!(w.join().unwrap().unwrap().clean_shutdown);
    }
}

#[test]
fn an_expert_parallel_worker_with_other_settings_is_refused_naming_both() {
    let g = ep_group(2, |_| WorkerOptions {
        engine: options(), // --expert-parallel missing on the worker
        fail_command: None,
    });
    let err = g.registry.model("moe").unwrap_err().to_string();
    assert!(
        err.contains("refused to start")
            && err.contains("--expert-parallel is off (experts sliced)")
            && err.contains("the head's is on (expert-parallel)"),
        "{err}"
    );
    for w in g.workers {
        assert!(w.join().unwrap().is_err());
    }
}

#[test]
fn a_worker_with_other_weights_is_refused_naming_both_digests() {
    let dir = moe_model(false);
    // The same config and seed, one tensor changed: same names and shapes, other bytes.
    let mixed = tempfile::tempdir().unwrap().keep();
    common::write_model_with(&mixed, &moe_config(false), 11, |t| {
        let bumped = (&t["model.norm.weight"] + 0.5).unwrap();
        t.insert("model.norm.weight".into(), bumped);
    });
    let (head, workers) = common::in_process_group(&mixed, 2, ep_worker);
    let r = registry(
        &dir,
        EngineOptions {
            tensor_parallel: Some(CommHandle(head)),
            expert_parallel: true,
            ..options()
        },
    );
    let err = r.model("moe").unwrap_err().to_string();
    assert!(
        err.contains("are not the head's") && err.matches("digest").count() >= 2,
        "{err}"
    );
    for w in workers {
        assert!(w.join().unwrap().is_err());
    }
}

#[test]
fn a_failed_command_on_an_expert_parallel_worker_keeps_it_up() {
    const POISON: u32 = 149_998;
    let g = ep_group(2, |_| WorkerOptions {
        engine: EngineOptions {
            expert_parallel: true,
            ..options()
        },
        fail_command: Some(Arc::new(
            |c: &WorkerCommand| matches!(c, WorkerCommand::Forward { tokens, .. } if tokens.contains(&POISON)),
        )),
    });
    let engine = g.registry.model("moe").unwrap().engine().clone();
    let mut bad = prompt(10, 5);
    bad[3] = POISON;
    let err = engine
        .generate(GenerationRequest::new(bad).max_new_tokens(4))
        .unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    let g2 = engine
        .generate(GenerationRequest::new(prompt(8, 6)).max_new_tokens(5))
        .unwrap();
    assert_eq!(g2.generated_tokens, 5, "the worker is still up");
    drop(engine);
    drop(g.registry);
    for w in g.workers {
        let r = w.join().unwrap().unwrap();
        assert!(r.failed >= 1 && r.clean_shutdown, "{r:?}");
    }
}

// ---- bad checkpoints and settings ----

fn broken(edit: impl FnOnce(&mut HashMap<String, Tensor>)) -> String {
    let dir = tempfile::tempdir().unwrap().keep();
    common::write_model_with(&dir, &moe_config(false), 11, edit);
    registry(&dir, options())
        .model("moe")
        .unwrap_err()
        .to_string()
}

#[test]
fn a_missing_expert_or_a_router_of_the_wrong_expert_count_is_named_at_load() {
    let err = broken(|t| {
        t.remove("model.layers.2.mlp.experts.5.up_proj.weight");
    });
    assert!(
        err.contains("model.layers.2.mlp.experts.5.up_proj.weight"),
        "{err}"
    );
    let err = broken(|t| {
        let r = t["model.layers.0.mlp.gate.weight"].narrow(0, 0, 6).unwrap();
        t.insert("model.layers.0.mlp.gate.weight".into(), r);
    });
    assert!(
        err.contains("model.layers.0.mlp.gate.weight") && err.contains('6'),
        "{err}"
    );
}

#[test]
fn an_expert_count_the_ep_world_does_not_divide_is_refused_naming_it() {
    let comms: Vec<Arc<InProcessComm>> = InProcessComm::group(3, Duration::from_secs(2))
        .into_iter()
        .map(Arc::new)
        .collect();
    let mut cfg = moe_config(false);
    cfg["num_attention_heads"] = 6.into();
    cfg["num_key_value_heads"] = 3.into();
    cfg["intermediate_size"] = 63.into();
    let dir = common::cached_model("moe-v1-heads6", &cfg, 12);
    let r = registry(
        &dir,
        EngineOptions {
            tensor_parallel: Some(CommHandle(comms[0].clone())),
            expert_parallel: true,
            ..options()
        },
    );
    let err = r.model("moe").unwrap_err().to_string();
    assert!(
        err.contains("expert-parallel world size 3 does not divide num_experts = 8"),
        "{err}"
    );
    // A dense model refuses expert parallelism outright.
    let dense = common::tiny_registry(EngineOptions {
        expert_parallel: true,
        ..options()
    });
    let err = dense.model("tiny").unwrap_err().to_string();
    assert!(
        err.contains("needs a mixture-of-experts checkpoint"),
        "{err}"
    );
}

#[test]
fn moe_configs_are_checked_and_untied_configs_list_lm_head() {
    use policy_serve::engine::ModelConfig;
    let mut cfg = moe_config(false);
    cfg["num_experts_per_tok"] = 9.into();
    let err = ModelConfig::from_json(&cfg.to_string())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("num_experts_per_tok (9) exceeds num_experts (8)"),
        "{err}"
    );
    let mut cfg = moe_config(false);
    cfg["mlp_only_layers"] = serde_json::json!([7]);
    let err = ModelConfig::from_json(&cfg.to_string())
        .unwrap_err()
        .to_string();
    assert!(err.contains("mlp_only_layers names layer 7"), "{err}");
    let c = ModelConfig::from_json(&moe_config(false).to_string()).unwrap();
    assert!(c.is_moe() && c.is_sparse_layer(0) && !c.is_sparse_layer(1));
    // transformers 5 writes the expert count as `num_local_experts`.
    let mut v5 = moe_config(false);
    let n = v5.as_object_mut().unwrap().remove("num_experts").unwrap();
    v5["num_local_experts"] = n;
    assert_eq!(ModelConfig::from_json(&v5.to_string()).unwrap(), c);
    // `bench --write-model` writes what this table lists: lm_head for an untied config.
    let eight: ModelConfig = serde_json::from_str(
        &std::fs::read_to_string(common::fixtures().join("qwen3/config-8b.json")).unwrap(),
    )
    .unwrap();
    let names: Vec<String> = policy_serve::testing::qwen3_tensor_specs(&eight)
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names.last().map(String::as_str), Some("lm_head.weight"));
    let moe_names: Vec<String> = policy_serve::testing::qwen3_tensor_specs(&c)
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert!(moe_names.contains(&"model.layers.2.mlp.experts.7.down_proj.weight".into()));
    assert!(moe_names.contains(&"model.layers.1.mlp.down_proj.weight".into()));
    assert!(!moe_names.contains(&"model.layers.0.mlp.down_proj.weight".into()));
}

#[test]
fn a_weight_update_of_an_moe_model_equals_a_fresh_load_of_the_new_weights() {
    let (a, b) = (
        moe_model(false),
        common::cached_model("moe-v1-seed13", &moe_config(false), 13),
    );
    let r = registry(&a, options());
    let tokens = prompt(13, 7);
    let before = r
        .model("moe")
        .unwrap()
        .engine()
        .logits(tokens.clone())
        .unwrap();
    r.update_weights(
        "moe",
        policy_serve::engine::WeightSource::Dir(b.clone()),
        true,
    )
    .unwrap();
    let after = r
        .model("moe")
        .unwrap()
        .engine()
        .logits(tokens.clone())
        .unwrap();
    let fresh = registry(&b, options())
        .model("moe")
        .unwrap()
        .engine()
        .logits(tokens)
        .unwrap();
    assert_eq!(after, fresh, "updated == fresh load, bit for bit");
    assert_ne!(before, after);
}
