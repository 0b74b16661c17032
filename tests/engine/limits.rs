//! The engine's limits and failures: bad requests, tiny KV pools and preemption, broken or
//! sharded checkpoints, callers that go away, memory pressure.

use super::*;

#[test]
fn bad_requests_fail_alone_with_clear_errors() {
    let opts = EngineOptions {
        kv_budget: KvBudget {
            blocks: Some(8),
            ..KvBudget::default()
        },
        ..options()
    };
    let r = registry_with(opts);
    let engine = r.model("tiny").unwrap().engine().clone();
    let ok = engine.submit(GenerationRequest::new(prompt(10, 70)).max_new_tokens(4));
    let too_big = engine
        .generate(GenerationRequest::new(prompt(100, 71)).max_new_tokens(100))
        .unwrap_err();
    assert!(matches!(too_big, Error::TooLarge(_)), "{too_big}");
    assert!(too_big.to_string().contains("8 blocks"), "{too_big}");
    let bad_token = engine
        .generate(GenerationRequest::new(vec![999_999]).max_new_tokens(1))
        .unwrap_err();
    assert!(bad_token.to_string().contains("outside the vocabulary"));
    let empty = engine
        .generate(GenerationRequest::new(vec![]).max_new_tokens(1))
        .unwrap_err();
    assert!(empty.to_string().contains("empty"));
    assert_eq!(ok.wait().unwrap().generated_tokens, 4);
}

/// Six prompts of 20-35 tokens, 24 new tokens each, submitted at once to an engine with
/// `opts`: their greedy tokens and the engine's stats after (the preemption workload).
pub(crate) fn six_at_once(
    opts: EngineOptions,
) -> (Vec<Vec<u32>>, policy_serve::engine::EngineStats) {
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| prompt(20 + i * 3, 80 + i as u32)).collect();
    let r = registry_with(opts);
    let engine = r.model("tiny").unwrap().engine().clone();
    let pending: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(GenerationRequest::new(p.clone()).max_new_tokens(24)))
        .collect();
    let out: Vec<Vec<u32>> = pending
        .into_iter()
        .map(|p| p.wait().unwrap().tokens)
        .collect();
    (out, engine.stats())
}

#[test]
fn a_tiny_kv_pool_preempts_and_still_gives_identical_outputs() {
    let (free, _) = six_at_once(options());
    for (prefix_cache, kv_host_gib) in [(true, 1.0), (true, 0.0), (false, 0.0), (false, 1.0)] {
        let small = EngineOptions {
            kv_budget: KvBudget {
                blocks: Some(10),
                ..KvBudget::default()
            },
            prefix_cache,
            kv_host_gib,
            ..options()
        };
        let (tight, stats) = six_at_once(small);
        assert_eq!(
            free, tight,
            "prefix cache {prefix_cache}, swap {kv_host_gib} GiB"
        );
        assert!(
            stats.preemptions > 0,
            "the pool was small enough to force preemption: {stats:?}"
        );
        assert_eq!(stats.swap_outs > 0, kv_host_gib > 0.0, "{stats:?}");
        assert_eq!(stats.swap_ins, stats.swap_outs);
        assert_eq!(
            stats.blocks_free + stats.cached_blocks,
            stats.blocks_total,
            "every block came back: {stats:?}"
        );
    }
}

#[test]
fn a_broken_checkpoint_names_the_tensor_and_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = common::write_tiny_model(tmp.path(), 5);
    let mut tensors = common::random_tensors(&common::tiny_config(), 5);
    tensors.remove("model.layers.1.mlp.up_proj.weight");
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    let r = ModelRegistry::new(vec![ModelSpec::local("b", "B", &dir)])
        .unwrap()
        .with_options(options());
    let err = r.model("b").unwrap_err().to_string();
    assert!(
        err.contains("model.layers.1.mlp.up_proj.weight")
            && err.contains("model.safetensors")
            && err.contains("missing"),
        "{err}"
    );

    let mut cfg = common::tiny_config();
    cfg["intermediate_size"] = 48.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    tensors.insert(
        "model.layers.1.mlp.up_proj.weight".into(),
        Tensor::zeros((48, 32), DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    let err = r.model("b").unwrap_err().to_string();
    assert!(err.contains("shape [64, 32], expected [48, 32]"), "{err}");

    cfg["model_type"] = "mamba".into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let err = r.model("b").unwrap_err().to_string();
    assert!(
        err.contains("`mamba` is not supported") && err.contains("qwen3"),
        "{err}"
    );
}

#[test]
fn a_caller_that_goes_away_frees_its_sequence() {
    let r = registry_with(options());
    let engine = r.model("tiny").unwrap().engine().clone();
    let pending = engine.submit(GenerationRequest::new(prompt(40, 90)).max_new_tokens(2000));
    std::thread::sleep(std::time::Duration::from_millis(50));
    drop(pending);
    let t = std::time::Instant::now();
    loop {
        let s = engine.stats();
        if s.requests_cancelled == 1 {
            assert_eq!(s.running, 0);
            assert_eq!(s.blocks_free + s.cached_blocks, s.blocks_total);
            break;
        }
        assert!(
            t.elapsed().as_secs() < 20,
            "the abandoned request kept running: {s:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The engine still serves others.
    assert_eq!(
        engine
            .generate(GenerationRequest::new(prompt(5, 91)).max_new_tokens(3))
            .unwrap()
            .generated_tokens,
        3
    );
}

#[test]
fn a_sharded_checkpoint_loads_and_gives_the_same_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = common::write_tiny_model(tmp.path(), 42);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let tensors = common::random_tensors(&common::tiny_config(), 42);
    let (mut a, mut b) = (
        std::collections::HashMap::new(),
        std::collections::HashMap::new(),
    );
    let mut map = serde_json::Map::new();
    for (i, (name, t)) in tensors.into_iter().enumerate() {
        let file = if i % 2 == 0 {
            "model-00001-of-00002.safetensors"
        } else {
            "model-00002-of-00002.safetensors"
        };
        map.insert(name.clone(), file.into());
        if i % 2 == 0 {
            a.insert(name, t)
        } else {
            b.insert(name, t)
        };
    }
    candle_core::safetensors::save(&a, dir.join("model-00001-of-00002.safetensors")).unwrap();
    candle_core::safetensors::save(&b, dir.join("model-00002-of-00002.safetensors")).unwrap();
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    let sharded = ModelRegistry::new(vec![ModelSpec::local("s", "S", &dir)])
        .unwrap()
        .with_options(options());
    let tokens = prompt(19, 11);
    let ours = sharded
        .model("s")
        .unwrap()
        .engine()
        .logits(tokens.clone())
        .unwrap();
    let single = registry_with(options())
        .model("tiny")
        .unwrap()
        .engine()
        .logits(tokens)
        .unwrap();
    assert!(max_rel_err(&ours, &single) <= 1e-6);
    assert_eq!(sharded.model("s").unwrap().files().weights.len(), 2);
}

#[test]
fn a_tensor_of_the_wrong_dtype_is_named_with_its_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = common::write_tiny_model(tmp.path(), 3);
    let mut tensors = common::random_tensors(&common::tiny_config(), 3);
    tensors.insert(
        "model.norm.weight".into(),
        Tensor::zeros(32, DType::I64, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    let r = ModelRegistry::new(vec![ModelSpec::local("d", "D", &dir)])
        .unwrap()
        .with_options(options());
    let err = r.model("d").unwrap_err().to_string();
    assert!(
        err.contains("model.norm.weight")
            && err.contains("dtype I64")
            && err.contains("model.safetensors"),
        "{err}"
    );
}

#[test]
fn kv_only_predicates_follow_the_architecture_table() {
    let mut cfg =
        policy_serve::engine::ModelConfig::from_json(&common::tiny_config().to_string()).unwrap();
    assert!(cfg.kv_only_prefix_cache_is_safe() && cfg.kv_only_swap_out_is_safe());
    for hybrid in ["qwen3_next", "jamba", "falcon_h1", "mamba"] {
        cfg.model_type = hybrid.into();
        assert!(
            !cfg.kv_only_prefix_cache_is_safe() && !cfg.kv_only_swap_out_is_safe(),
            "{hybrid}"
        );
        assert!(!cfg.kv_only_reason().is_empty());
    }
    cfg.model_type = "something_new".into();
    assert!(
        !cfg.kv_only_prefix_cache_is_safe(),
        "unknown architectures are not assumed safe"
    );
}

#[test]
fn under_memory_pressure_the_newest_request_gives_way_even_while_the_oldest_still_prefills() {
    // 8 blocks of 16 tokens. A (80-token prompt) prefills in chunks of 16 while B (8 tokens,
    // submitted after A) already decodes; when B's third block is wanted none is free. B is the
    // newest, so B is preempted, not A (which has generated nothing yet).
    let opts = EngineOptions {
        kv_budget: KvBudget {
            blocks: Some(8),
            ..KvBudget::default()
        },
        prefill_chunk: 16,
        max_batched_tokens: 32,
        prefix_cache: false,
        kv_host_gib: 0.0,
        ..options()
    };
    let r = registry_with(opts);
    let engine = r.model("tiny").unwrap().engine().clone();
    let mut a = GenerationRequest::new(prompt(80, 120)).max_new_tokens(30);
    a.ignore_eos = true;
    let mut b = GenerationRequest::new(prompt(8, 121)).max_new_tokens(40);
    b.ignore_eos = true;
    let (pa, pb) = (engine.submit(a.clone()), engine.submit(b.clone()));
    let (ga, gb) = (pa.wait().unwrap(), pb.wait().unwrap());
    assert_eq!(ga.preemptions, 0, "the oldest request kept its memory");
    assert!(gb.preemptions >= 1, "the newest gave way: {gb:?}");
    assert!(engine.stats().preemptions >= 1);
    // Preemption changes no greedy token.
    let alone = engine.generate(b).unwrap();
    assert_eq!(gb.tokens, alone.tokens);
    assert_eq!(ga.tokens, engine.generate(a).unwrap().tokens);
}
