//! LoRA adapters by key and by file: an adapter key in the registry (shares its base, updates
//! in place while requests stream) and every adapter the engine refuses, by name.

use super::lora::{Spec, adapter_config, engine_on, write_adapter, write_adapter_with};
use super::*;
use policy_serve::engine::LoraOptions;
use serde_json::json;
use std::path::Path;

fn refusal(dir: &Path, max_rank: usize) -> String {
    let opts = EngineOptions {
        lora: Some(LoraOptions {
            max_loras: 2,
            max_lora_rank: max_rank,
        }),
        ..options()
    };
    let (_r, engine) = engine_on(&common::shared_tiny_model(), opts);
    let e = engine.load_adapter("bad", dir).unwrap_err();
    assert!(matches!(e, Error::Adapter { .. }), "{e:?}");
    e.to_string()
}

/// Every adapter the engine could not serve exactly is refused with the file and the tensor
/// or key at fault; the engine keeps serving.
#[test]
fn adapters_the_engine_cannot_serve_are_refused_by_name() {
    let s = Spec::default();
    let dora = write_adapter_with(&s, |c| c["use_dora"] = json!(true), |_| {});
    assert!(refusal(&dora, 8).contains("use_dora"));
    let magnitude = write_adapter_with(
        &s,
        |_| {},
        |t| {
            t.insert(
                "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector".into(),
                Tensor::ones(64, DType::F32, &Device::Cpu).unwrap(),
            );
        },
    );
    let m = refusal(&magnitude, 8);
    assert!(
        m.contains("lora_magnitude_vector") && m.contains("DoRA"),
        "{m}"
    );
    let head = write_adapter_with(
        &s,
        |c| c["target_modules"] = json!(["q_proj", "lm_head"]),
        |_| {},
    );
    assert!(refusal(&head, 8).contains("lm_head"));
    let embed = write_adapter_with(
        &s,
        |_| {},
        |t| {
            t.insert(
                "base_model.model.model.embed_tokens.lora_embedding_A".into(),
                Tensor::ones((4, 16), DType::F32, &Device::Cpu).unwrap(),
            );
        },
    );
    assert!(refusal(&embed, 8).contains("embed_tokens"));
    let big = write_adapter(&Spec {
        rank: 8,
        ..Spec::default()
    });
    let m = refusal(&big, 4);
    assert!(
        m.contains("rank 8") && m.contains("--max-lora-rank 4") && m.contains("lora_A.weight"),
        "{m}"
    );
    let shape = write_adapter_with(
        &s,
        |_| {},
        |t| {
            t.insert(
                "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight".into(),
                Tensor::ones((31, 4), DType::F32, &Device::Cpu).unwrap(),
            );
        },
    );
    let m = refusal(&shape, 8);
    assert!(
        m.contains("layers.1.mlp.down_proj.lora_B.weight") && m.contains("[31, 4]"),
        "{m}"
    );
    let lone = write_adapter_with(
        &s,
        |_| {},
        |t| {
            t.remove("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight");
        },
    );
    let m = refusal(&lone, 8);
    assert!(m.contains("layers.0.mlp.up_proj.lora_B"), "{m}");
    let bias = write_adapter_with(&s, |c| c["bias"] = json!("lora_only"), |_| {});
    assert!(refusal(&bias, 8).contains("bias"));
    let deep = write_adapter_with(
        &s,
        |_| {},
        |t| {
            t.insert(
                "base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight".into(),
                Tensor::ones((4, 32), DType::F32, &Device::Cpu).unwrap(),
            );
        },
    );
    assert!(refusal(&deep, 8).contains("layer 7"));
    let pickle = tempfile::tempdir().unwrap().keep();
    std::fs::write(
        pickle.join("adapter_config.json"),
        adapter_config(&s).to_string(),
    )
    .unwrap();
    std::fs::write(pickle.join("adapter_model.bin"), b"not read").unwrap();
    assert!(refusal(&pickle, 8).contains("adapter_model.bin"));
    let truncated = write_adapter(&s);
    let f = truncated.join("adapter_model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    assert!(refusal(&truncated, 8).contains("adapter_model.safetensors"));
    // An engine without adapters says how to turn them on.
    let (_r, plain) = engine_on(&common::shared_tiny_model(), options());
    let e = plain.load_adapter("a", &write_adapter(&s)).unwrap_err();
    assert!(e.to_string().contains("--enable-lora"), "{e}");
}

fn registry_with_adapter(dir: &Path) -> ModelRegistry {
    ModelRegistry::new(vec![
        ModelSpec::local("tiny", "Tiny", common::shared_tiny_model()),
        ModelSpec::adapter(
            "tiny-a",
            "Tiny + adapter",
            "tiny",
            policy_serve::ModelSource::Local(dir.to_path_buf()),
        ),
    ])
    .unwrap()
    .with_options(options())
}

fn on_key(r: &ModelRegistry, key: &str, salt: u32) -> policy_serve::Generation {
    let m = r.model(key).unwrap();
    let mut req = GenerationRequest::new(prompt(20, salt)).max_new_tokens(10);
    req.ignore_eos = true;
    req.adapter = m.adapter();
    m.engine().generate(req).unwrap()
}

/// An adapter key in the registry shares its base (one load) and reserves the base's LoRA
/// slots by itself; `update_weights` of the adapter key while 8 requests stream: each
/// finishes on the version it started on, later requests run on the new one and equal a fresh
/// registry on it, a broken update leaves the version serving, and after ten updates one
/// version is left in the engine. Mutations that fail it: retiring without draining (the
/// streams would end early or switch versions), retired versions never dropped.
#[test]
fn a_registry_adapter_key_shares_its_base_and_updates_in_place() {
    let (v1_dir, v2_dir) = (
        write_adapter(&Spec::default()),
        write_adapter(&Spec {
            seed: 33,
            ..Spec::default()
        }),
    );
    let r = registry_with_adapter(&v1_dir);
    let base = on_key(&r, "tiny", 40);
    let v1 = on_key(&r, "tiny-a", 40);
    assert_eq!(r.load_attempts("tiny"), 1, "the base loaded once");
    assert_ne!(base.tokens, v1.tokens);
    assert_eq!(v1.weights_version.adapter.as_ref().unwrap().version, 1);
    // The policy of the adapter key answers through the adapter.
    let episode = policy_serve::EpisodeConfig {
        max_new_tokens: Some(4),
        ..Default::default()
    };
    let mut policy = r.get_policy("tiny-a", episode).unwrap();
    let step = policy.act("hello".into()).unwrap();
    let adapter = step.cost.weights_version.unwrap().adapter.unwrap();
    assert_eq!((adapter.name.as_str(), adapter.version), ("tiny-a", 1));

    let m = r.model("tiny-a").unwrap();
    let streams: Vec<_> = (0..8)
        .map(|i| {
            let mut req = GenerationRequest::new(prompt(20, 40 + i)).max_new_tokens(24);
            req.ignore_eos = true;
            req.adapter = m.adapter();
            m.engine().submit_streaming(req)
        })
        .collect();
    let want_v1: Vec<Vec<u32>> = {
        let fresh = registry_with_adapter(&v1_dir);
        (0..8)
            .map(|i| {
                let fm = fresh.model("tiny-a").unwrap();
                let mut req = GenerationRequest::new(prompt(20, 40 + i)).max_new_tokens(24);
                req.ignore_eos = true;
                req.adapter = fm.adapter();
                fm.engine().generate(req).unwrap().tokens
            })
            .collect()
    };
    let v = r
        .update_weights(
            "tiny-a",
            policy_serve::engine::WeightSource::Dir(v2_dir.clone()),
            true,
        )
        .unwrap();
    assert_eq!(v.adapter.as_ref().unwrap().version, 2);
    for (i, (pending, mut stream)) in streams.into_iter().enumerate() {
        while stream.next_blocking().is_some() {}
        let g = pending.wait().unwrap();
        assert_eq!(g.weights_version.adapter.as_ref().unwrap().version, 1);
        assert_eq!(g.tokens, want_v1[i], "request {i} finished on v1");
    }
    let after = on_key(&r, "tiny-a", 40);
    assert_eq!(after.weights_version.adapter.as_ref().unwrap().version, 2);
    assert_eq!(
        after.tokens,
        on_key(&registry_with_adapter(&v2_dir), "tiny-a", 40).tokens
    );
    assert_eq!(
        on_key(&r, "tiny", 40).tokens,
        base.tokens,
        "the base is untouched"
    );

    let broken = tempfile::tempdir().unwrap().keep();
    std::fs::write(broken.join("adapter_config.json"), b"{\"r\": 4}").unwrap();
    std::fs::write(broken.join("adapter_model.safetensors"), b"nonsense").unwrap();
    let e = r
        .update_weights(
            "tiny-a",
            policy_serve::engine::WeightSource::Dir(broken),
            true,
        )
        .unwrap_err();
    assert!(matches!(e, Error::WeightUpdate(_)), "{e}");
    assert_eq!(
        on_key(&r, "tiny-a", 40)
            .weights_version
            .adapter
            .unwrap()
            .version,
        2
    );
    for i in 0..10 {
        let dir = if i % 2 == 0 { &v1_dir } else { &v2_dir };
        r.update_weights(
            "tiny-a",
            policy_serve::engine::WeightSource::Dir(dir.clone()),
            true,
        )
        .unwrap();
    }
    let g = on_key(&r, "tiny-a", 40);
    assert_eq!(g.weights_version.adapter.unwrap().version, 12);
    assert_eq!(g.tokens, after.tokens, "version 12 is v2's files again");
    assert_eq!(
        m.engine().stats().adapters,
        1,
        "retired versions left the engine"
    );
}
