//! New weights over HTTP: off without `--allow-weight-updates` (403 naming it), from disk with
//! it (every later answer carries the new `weights_version` and equals a server started on
//! those weights), refusals as 400s that keep the old weights serving, and the NCCL routes'
//! answers on a build or device that cannot take them.

use super::*;

fn model_b() -> std::path::PathBuf {
    common::cached_model("tiny-v1-seed7", &common::tiny_config(), 7)
}

const ROUTES: [&str; 5] = [
    "/v1/models/tiny/weights",
    "/init_weight_transfer_engine",
    "/start_weight_update",
    "/update_weights",
    "/finish_weight_update",
];

#[tokio::test(flavor = "multi_thread")]
async fn weight_routes_are_off_without_the_flag() {
    let s = start(&[]).await;
    for route in ROUTES {
        let (status, v) = post(&s, route, json!({"path": "/tmp"})).await;
        assert_eq!(status, 403, "{route}: {v}");
        assert_eq!(
            v["error"]["code"], "weight_updates_disabled",
            "{route}: {v}"
        );
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("--allow-weight-updates"), "{msg}");
    }
    let (_, info) = get_json(&s, "/server_info").await;
    assert!(
        info["vllm_config"]["weight_transfer_config"].is_null(),
        "{info}"
    );
    let cfg = serve::Config::parse_from([
        "serve",
        "--addr",
        "0.0.0.0:0",
        "--models",
        "demo",
        "--allow-weight-updates",
    ]);
    let e = serve::AppState::new(cfg)
        .err()
        .expect("refused beyond loopback without a token");
    assert!(e.to_string().contains("needs --token"), "{e}");
}

async fn get_json(s: &Server, path: &str) -> (u16, Value) {
    let r = reqwest::get(format!("{}{path}", s.base)).await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn greedy_ids(s: &Server) -> (Vec<u64>, u64) {
    let prompt: Vec<u32> = common::prompt(20, 900);
    let (status, v) = post(
        s,
        "/v1/completions",
        json!({"model": "tiny", "prompt": prompt, "max_tokens": 10, "temperature": 0,
            "return_token_ids": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let ids = v["choices"][0]["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(
        v["choices"][0]["weights_version"], v["weights_version"]["version"],
        "{v}"
    );
    (ids, v["weights_version"]["version"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn new_weights_from_disk_over_http() {
    let s = start(&["--allow-weight-updates"]).await;
    let (before, v0) = greedy_ids(&s).await;
    assert_eq!(v0, 0);
    let b_dir = model_b();
    let b_arg = format!("tiny={}", b_dir.display());
    let on_b = start(&["--model-dir", b_arg.as_str()]).await;
    let (want, _) = greedy_ids(&on_b).await;
    assert_ne!(before, want);

    let (status, v) = post(
        &s,
        "/v1/models/tiny/weights",
        json!({"path": b_dir, "drain": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["weights_version"]["version"], 1, "{v}");
    assert_eq!(v["weights_version"]["digest"].as_str().unwrap().len(), 16);
    let (after, v1) = greedy_ids(&s).await;
    assert_eq!((after.clone(), v1), (want.clone(), 1));
    let (_, models) = get_json(&s, "/v1/models").await;
    let tiny = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "tiny")
        .unwrap();
    assert_eq!(tiny["weights_version"], v["weights_version"], "{models}");

    // Refusals: 400 with the reason; the new weights keep serving.
    let broken = tempfile::tempdir().unwrap();
    std::fs::write(broken.path().join("model.safetensors"), b"not safetensors").unwrap();
    for (body, want_msg) in [
        (json!({"path": broken.path()}), "weight update refused"),
        (json!({"path": "/no/such/dir"}), "no model.safetensors"),
        (
            json!({"path": b_dir, "drian": false}),
            "unknown field `drian`",
        ),
        (json!({"drain": false}), "missing field `path`"),
    ] {
        let (status, v) = post(&s, "/v1/models/tiny/weights", body.clone()).await;
        assert_eq!(status, 400, "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want_msg), "{body}: {msg}");
    }
    let (status, v) = post(&s, "/v1/models/nope/weights", json!({"path": b_dir})).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(greedy_ids(&s).await, (want, 1));

    // The NCCL routes: no group yet, and none can be made on a CPU engine.
    let int8 = json!({"update_info": {"names": ["model.norm.weight"], "dtype_names": ["int8"], "shapes": [[32]]}});
    for (route, body) in [
        ("/start_weight_update", json!({})),
        ("/finish_weight_update", json!({})),
        ("/update_weights", int8),
    ] {
        let (status, v) = post(&s, route, body).await;
        assert_eq!(status, 400, "{route}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("init_weight_transfer_engine first"),
            "{v}"
        );
    }
    let (status, v) = post(
        &s,
        "/init_weight_transfer_engine",
        json!({"init_info": {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("--features nccl") || msg.contains("CPU"),
        "{msg}"
    );
    let (status, v) = post(
        &s,
        "/init_weight_transfer_engine",
        json!({"init_info": {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 5}}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("make 2"),
        "{v}"
    );
}
