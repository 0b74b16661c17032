//! The episodes API over HTTP: lifecycle, expiry, the cap, and the sampling defaults it
//! shares with chat.

use serde_json::json;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_episode_lives_acts_and_is_deleted() {
    let s = start(&[]).await;
    for model in ["demo", "tiny"] {
        let (code, v) = post(&s, "/v1/episodes", json!({"model": model, "system_prompt": "Be brief.", "tools": tools(), "max_tokens": 6, "temperature": 0})).await;
        assert_eq!(code, 201, "{v}");
        let id = v["id"].as_str().unwrap().to_string();
        let (code, step) = post(
            &s,
            &format!("/v1/episodes/{id}/act"),
            json!({"observation": "How many users?"}),
        )
        .await;
        assert_eq!(code, 200, "{step}");
        assert!(step["action"]["type"].is_string() && step["raw"].is_string());
        assert!(step["cost"]["latency_ms"].is_number());
        let (code, _) = post(
            &s,
            &format!("/v1/episodes/{id}/act"),
            json!({"observation": ["result one"]}),
        )
        .await;
        assert_eq!(code, 200);
        let r = reqwest::Client::new()
            .delete(format!("{}/v1/episodes/{id}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
        let (code, err) = post(
            &s,
            &format!("/v1/episodes/{id}/act"),
            json!({"observation": "x"}),
        )
        .await;
        assert_eq!(code, 404);
        assert!(err["error"]["message"].as_str().unwrap().contains(&id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_episodes_expire_and_the_episode_cap_is_enforced() {
    let s = start(&["--episode-ttl-secs", "1", "--max-episodes", "1"]).await;
    let (code, v) = post(
        &s,
        "/v1/episodes",
        json!({"model": "demo", "tools": tools()}),
    )
    .await;
    assert_eq!(code, 201);
    let id = v["id"].as_str().unwrap().to_string();
    let (code, err) = post(
        &s,
        "/v1/episodes",
        json!({"model": "demo", "tools": tools()}),
    )
    .await;
    assert_eq!(code, 429, "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("DELETE"));
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    let (code, _) = post(
        &s,
        &format!("/v1/episodes/{id}/act"),
        json!({"observation": "x"}),
    )
    .await;
    assert_eq!(code, 404, "the idle episode expired");
}

/// A copy of the tiny model whose generation_config samples but names no temperature.
fn sampling_model_without_temperature() -> std::path::PathBuf {
    let dir = common::tiny_model_copy();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"do_sample": true, "top_k": 20, "eos_token_id": [151645, 151643]}"#,
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_and_episodes_apply_the_same_sampling_defaults() {
    let dir = sampling_model_without_temperature();
    let s = start(&["--model-dir", &format!("sampler={}", dir.display())]).await;
    let system = "Use the tools well and answer precisely.";
    let user = "Count the users";
    let chat = |seed: u64| {
        json!({"model": "sampler", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
               "tools": tools(), "max_tokens": 12, "seed": seed})
    };
    let (code, a) = post(&s, "/v1/chat/completions", chat(7)).await;
    assert_eq!(code, 200, "{a}");
    let (code, ep) = post(&s, "/v1/episodes", json!({"model": "sampler", "system_prompt": system, "tools": tools(), "max_tokens": 12, "seed": 7})).await;
    assert_eq!(code, 201, "{ep}");
    let id = ep["id"].as_str().unwrap();
    let (code, step) = post(
        &s,
        &format!("/v1/episodes/{id}/act"),
        json!({"observation": user}),
    )
    .await;
    assert_eq!(code, 200, "{step}");
    // Same prompt, same seed, same defaults: the same text (the chat's content holds the raw
    // text when it is no valid tool call).
    let chat_text = a["choices"][0]["message"]["content"].as_str().unwrap_or("");
    let raw = step["raw"].as_str().unwrap();
    if a["choices"][0]["message"]["tool_calls"].is_null() {
        assert_eq!(chat_text, raw);
    } else {
        assert!(raw.contains("<tool_call>"), "{raw}");
    }
    // Positive control: the chat really samples (HF's temperature 1.0 when do_sample names
    // none, not greedy): its output changes with the seed.
    let mut outputs = std::collections::HashSet::new();
    for seed in [7u64, 8, 9, 10] {
        let (_, v) = post(&s, "/v1/chat/completions", chat(seed)).await;
        outputs.insert(v["choices"][0]["message"].to_string());
    }
    assert!(outputs.len() > 1, "seeds made no difference: {outputs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_episode_cap_holds_for_concurrent_creates_while_the_model_loads() {
    let s = start(&["--max-episodes", "3"]).await;
    let client = reqwest::Client::new();
    let sends: Vec<_> = (0..24)
        .map(|_| {
            client
                .post(format!("{}/v1/episodes", s.base))
                .json(&json!({"model": "tiny", "tools": tools()}))
                .send()
        })
        .collect();
    let mut codes: Vec<u16> = Vec::new();
    for r in futures_util::future::join_all(sends).await {
        codes.push(r.unwrap().status().as_u16());
    }
    assert_eq!(codes.iter().filter(|c| **c == 201).count(), 3, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 429).count(), 21, "{codes:?}");
}
