//! LoRA adapters over HTTP: `--adapter NAME=BASE_KEY:DIR` serves NAME as a model (listed with
//! its base as `parent`), answers carry the adapter's version, and
//! `POST /v1/models/NAME/weights` loads a new version (a broken one is a 400 that changes
//! nothing).

use super::*;

fn adapter_dir() -> std::path::PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    let cfg: policy_serve::engine::ModelConfig =
        serde_json::from_value(common::tiny_config()).unwrap();
    policy_serve::testing::write_random_adapter(&dir, &cfg, 4, 0.3).unwrap();
    dir
}

async fn completion(s: &Server, model: &str) -> Value {
    let (status, v) = post(
        s,
        "/v1/completions",
        json!({"model": model, "prompt": common::prompt(16, 5), "max_tokens": 8,
            "temperature": 0, "return_token_ids": true, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adapter_is_served_as_a_model_and_updated_over_http() {
    let v1 = adapter_dir();
    let arg = format!("tiny-a=tiny:{}", v1.display());
    let s = start(&["--allow-weight-updates", "--adapter", arg.as_str()]).await;
    let base = completion(&s, "tiny").await;
    let a1 = completion(&s, "tiny-a").await;
    assert_ne!(
        base["choices"][0]["token_ids"], a1["choices"][0]["token_ids"],
        "the adapter changes the answer"
    );
    assert!(base["weights_version"]["adapter"].is_null(), "{base}");
    assert_eq!(a1["weights_version"]["adapter"]["name"], "tiny-a", "{a1}");
    assert_eq!(a1["weights_version"]["adapter"]["version"], 1, "{a1}");
    let r = reqwest::get(format!("{}/v1/models", s.base)).await.unwrap();
    let models: Value = r.json().await.unwrap();
    let entry = |id: &str| {
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .cloned()
            .unwrap()
    };
    assert_eq!(entry("tiny-a")["parent"], "tiny", "{models}");
    assert!(entry("tiny")["parent"].is_null(), "{models}");
    assert_eq!(entry("tiny-a")["weights_version"]["adapter"]["version"], 1);

    let v2 = adapter_dir();
    let (status, v) = post(&s, "/v1/models/tiny-a/weights", json!({"path": v2})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["weights_version"]["adapter"]["version"], 2, "{v}");
    let a2 = completion(&s, "tiny-a").await;
    assert_eq!(a2["weights_version"]["adapter"]["version"], 2);
    assert_ne!(a2["choices"][0]["token_ids"], a1["choices"][0]["token_ids"]);
    assert_eq!(
        completion(&s, "tiny").await["choices"][0]["token_ids"],
        base["choices"][0]["token_ids"],
        "the base is untouched"
    );
    let metrics = reqwest::get(format!("{}/metrics", s.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("policy_serve_lora_adapter_loads_total{model=\"tiny\"} 2"),
        "two versions moved into a slot: {metrics}"
    );
    assert!(
        !metrics.contains("model=\"tiny-a\""),
        "engine figures once per engine: {metrics}"
    );
    // A broken adapter: 400 naming it; version 2 keeps serving.
    let broken = tempfile::tempdir().unwrap().keep();
    std::fs::write(
        broken.join("adapter_config.json"),
        "{\"r\": 4, \"use_dora\": true}",
    )
    .unwrap();
    std::fs::write(broken.join("adapter_model.safetensors"), b"x").unwrap();
    let (status, v) = post(&s, "/v1/models/tiny-a/weights", json!({"path": broken})).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("use_dora"),
        "{v}"
    );
    assert_eq!(
        completion(&s, "tiny-a").await["choices"][0]["token_ids"],
        a2["choices"][0]["token_ids"]
    );
}
