//! The registry through its public API: listing, typed errors, load-once under concurrency,
//! failed loads not cached, demo policies.

mod common;

use std::sync::Arc;

use policy_serve::{EngineOptions, EpisodeConfig, Error, ModelRegistry, ModelSpec};

fn cpu_options() -> EngineOptions {
    EngineOptions {
        device: policy_serve::engine::DeviceChoice::Cpu,
        ..EngineOptions::default()
    }
}

#[test]
fn the_default_registry_lists_the_demo_first_and_the_four_qwen3_models() {
    let r = ModelRegistry::with_defaults();
    let keys: Vec<String> = r.specs().map(|s| s.key.clone()).collect();
    assert_eq!(
        keys,
        [
            "demo",
            "qwen3-0.6b",
            "qwen3-1.7b",
            "sqlenv-qwen3-1.7b-grpo",
            "qwen3-30b-a3b"
        ]
    );
    assert_eq!(r.default_key(), "demo");
    assert!(r.specs().all(|s| !s.enable_thinking));
    let choices = r.choices();
    assert_eq!(choices[0].1, "demo");
    assert_eq!(choices.len(), 5);
}

#[test]
fn unavailable_models_are_listed_as_coming_soon_and_refused() {
    let r = ModelRegistry::new(vec![
        ModelSpec::demo(),
        ModelSpec::hub("big", "Big Model", "org/big", "main").coming_soon(),
    ])
    .unwrap();
    assert_eq!(r.choices()[1].0, "Big Model — coming soon");
    let err = r.get_policy("big", EpisodeConfig::default()).unwrap_err();
    assert!(
        matches!(err, Error::ModelUnavailable { ref key, .. } if key == "big"),
        "{err}"
    );
    assert!(err.to_string().contains("Big Model"));
}

#[test]
fn an_unknown_key_is_a_typed_error_listing_the_known_keys() {
    let r = ModelRegistry::with_defaults();
    let err = r.get_policy("gpt-9", EpisodeConfig::default()).unwrap_err();
    match &err {
        Error::UnknownModel { key, known } => {
            assert_eq!(key, "gpt-9");
            assert!(known.contains("qwen3-0.6b"));
        }
        other => panic!("wrong error {other}"),
    }
}

#[test]
fn asking_the_demo_for_weights_is_a_demo_misuse_error() {
    let r = ModelRegistry::with_defaults();
    assert!(matches!(
        r.model("demo").unwrap_err(),
        Error::DemoMisuse { .. }
    ));
}

#[test]
fn duplicate_and_empty_keys_are_refused() {
    assert!(ModelRegistry::new(vec![ModelSpec::demo(), ModelSpec::demo()]).is_err());
    assert!(ModelRegistry::new(vec![]).is_err());
}

#[test]
fn the_hub_offline_without_a_cache_fails_with_the_repo_and_how_to_use_a_local_dir() {
    let cache = tempfile::tempdir().unwrap();
    // SAFETY: this test binary sets these variables only here, before any other thread reads them.
    unsafe {
        std::env::set_var("HF_HUB_OFFLINE", "1");
        std::env::set_var("HF_HOME", cache.path());
    }
    let r = ModelRegistry::with_defaults().with_options(cpu_options());
    let err = r
        .get_policy("qwen3-0.6b", EpisodeConfig::default())
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Download { .. }), "{msg}");
    assert!(
        msg.contains("Qwen/Qwen3-0.6B") && msg.contains("--model-dir"),
        "{msg}"
    );
    assert_eq!(r.load_attempts("qwen3-0.6b"), 1);
}

#[test]
fn eight_threads_asking_for_one_model_load_it_once_and_get_fresh_policies() {
    let dir = common::shared_tiny_model();
    let r = Arc::new(
        ModelRegistry::new(vec![
            ModelSpec::demo(),
            ModelSpec::local("tiny", "Tiny", &dir),
        ])
        .unwrap()
        .with_options(cpu_options()),
    );
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let r = r.clone();
            std::thread::spawn(move || {
                r.get_policy("tiny", EpisodeConfig::default())
                    .map(|p| p.transcript().len())
            })
        })
        .collect();
    for h in handles {
        assert_eq!(
            h.join().unwrap().unwrap(),
            0,
            "each policy starts with an empty transcript"
        );
    }
    assert_eq!(r.load_attempts("tiny"), 1);
    assert!(r.is_loaded("tiny"));
    let a = r.model("tiny").unwrap();
    let b = r.model("tiny").unwrap();
    assert!(Arc::ptr_eq(&a, &b), "the weights are shared");
}

#[test]
fn a_failed_load_is_not_cached_and_the_next_call_retries() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    std::fs::create_dir_all(&dir).unwrap();
    let r = ModelRegistry::new(vec![ModelSpec::local("m", "M", &dir)])
        .unwrap()
        .with_options(cpu_options());
    let err = r.model("m").unwrap_err();
    assert!(matches!(err, Error::Load { .. }), "{err}");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    assert_eq!(r.load_attempts("m"), 1);
    assert!(!r.is_loaded("m"));
    common::write_tiny_model(&dir, 1);
    r.model("m").unwrap();
    assert_eq!(r.load_attempts("m"), 2);
    r.model("m").unwrap();
    assert_eq!(r.load_attempts("m"), 2);
}

#[test]
fn preload_loads_what_it_can_and_skips_failures() {
    let dir = common::shared_tiny_model();
    let r = ModelRegistry::new(vec![
        ModelSpec::demo(),
        ModelSpec::local("good", "Good", &dir),
        ModelSpec::local("broken", "Broken", "/nonexistent/model"),
        ModelSpec::local("later", "Later", &dir).coming_soon(),
    ])
    .unwrap()
    .with_options(cpu_options());
    assert_eq!(r.preload_available(), ["good"]);
    assert!(!r.is_loaded("later"));
}

#[test]
fn a_spec_can_be_pointed_at_a_local_dir() {
    let dir = common::shared_tiny_model();
    let r = ModelRegistry::with_defaults()
        .with_options(cpu_options())
        .with_local_dir("qwen3-0.6b", &dir)
        .unwrap();
    assert_eq!(r.specs().nth(1).unwrap().key, "qwen3-0.6b", "position kept");
    r.model("qwen3-0.6b").unwrap();
}

#[test]
fn shard_names_must_stay_inside_the_model_directory() {
    let src = common::shared_tiny_model();
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    for name in [
        "../outside.safetensors",
        "/etc/passwd",
        "sub/../../x.safetensors",
    ] {
        let index = serde_json::json!({"weight_map": {"model.embed_tokens.weight": name}});
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        let r = ModelRegistry::new(vec![ModelSpec::local("m", "M", dir.path())]).unwrap();
        let err = r.model("m").unwrap_err().to_string();
        assert!(
            err.contains("not a file name inside the model directory"),
            "{name}: {err}"
        );
    }
}
