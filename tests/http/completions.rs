//! `POST /v1/completions` as an RL trainer drives it (vLLM's fields: token-id prompts, `n`,
//! `return_token_ids`, `logprobs`), and the routes its client reads besides
//! (`/get_world_size`, `/reset_prefix_cache`).

use serde_json::{Value, json};

use super::{post, start};

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[tokio::test]
async fn token_id_prompts_times_n_come_back_prompt_major_with_their_ids() {
    let s = start(&[]).await;
    let prompts = [vec![11u32, 12, 13, 14, 15], vec![21, 22, 23]];
    let (code, body) = post(
        &s,
        "/v1/completions",
        json!({"model": "tiny", "prompt": prompts, "n": 3, "max_tokens": 6, "min_tokens": 6,
            "temperature": 1.0, "seed": 7, "return_token_ids": true}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 6);
    let mut generated = 0;
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        // Prompt-major: choices 0-2 are the first prompt's samples, 3-5 the second's.
        assert_eq!(ids(&c["prompt_token_ids"]), prompts[i / 3], "choice {i}");
        assert_eq!(ids(&c["token_ids"]).len(), 6);
        assert_eq!(c["finish_reason"], "length");
        assert!(c["logprobs"].is_null());
        generated += 6;
    }
    assert_eq!(
        body["usage"]["prompt_tokens"], 8,
        "each prompt counted once"
    );
    assert_eq!(body["usage"]["completion_tokens"], generated);
    // Without return_token_ids, no ids.
    let (_, plain) = post(
        &s,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "hello there", "max_tokens": 3}),
    )
    .await;
    assert!(plain["choices"][0].get("token_ids").is_none());
    assert!(plain["choices"][0]["text"].is_string());
}

/// A prompt where the tiny model's next-token distribution is not one token (most of its
/// prompts give one token all the mass).
fn varied_prompt() -> Vec<u32> {
    (0..50).map(|i| (i * 7919 + 1179) % 5000 + 100).collect()
}

#[tokio::test]
async fn samples_of_one_seed_differ_from_each_other_and_repeat_across_requests() {
    let s = start(&[]).await;
    let body = json!({"model": "tiny", "prompt": [varied_prompt()], "n": 4, "max_tokens": 12,
        "min_tokens": 12, "temperature": 1.5, "top_p": 1.0, "seed": 1234,
        "return_token_ids": true});
    let run = |b: Value| {
        let s = &s;
        async move {
            let (code, r) = post(s, "/v1/completions", b).await;
            assert_eq!(code, 200, "{r}");
            r["choices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| ids(&c["token_ids"]))
                .collect::<Vec<_>>()
        }
    };
    // Each run on an empty prefix cache: a prompt prefilled whole and one found cached give
    // logits equal only to rounding, enough to move a draw of this tiny model (its logits are
    // in the hundreds).
    let reset = || async { assert_eq!(post(&s, "/reset_prefix_cache", json!({})).await.0, 200) };
    reset().await;
    let a = run(body.clone()).await;
    reset().await;
    let b = run(body.clone()).await;
    assert_eq!(
        a, b,
        "one seed, the same samples (mutation: a fresh seed per request)"
    );
    let distinct: std::collections::HashSet<_> = a.iter().collect();
    assert_eq!(
        distinct.len(),
        4,
        "the n samples differ (mutation: every sample seeded alike): {a:?}"
    );
    let mut other = body;
    other["seed"] = json!(99);
    reset().await;
    assert_ne!(run(other).await, a, "another seed, other samples");
}

#[tokio::test]
async fn the_samples_of_a_prompt_share_its_prefill() {
    let s = start(&[]).await;
    let engine = s.state.registry().model("tiny").unwrap().engine().clone();
    let prompt: Vec<u32> = (0..100).map(|i| 300 + i).collect();
    let before = engine.stats().prefill_tokens;
    let (code, body) = post(
        &s,
        "/v1/completions",
        json!({"model": "tiny", "prompt": [prompt], "n": 4, "max_tokens": 2, "temperature": 1.0}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let computed = engine.stats().prefill_tokens - before;
    // One prefill of 100 tokens; the other three samples find its 6 whole blocks cached and
    // compute at most the partial block (4 tokens) each (mutation: admitting the samples
    // alongside the first, before its prompt is cached, computes 400).
    assert!(
        computed <= 100 + 3 * 16,
        "prefill tokens computed: {computed}"
    );
}

/// The log-softmax of a logits row.
fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
    row.iter().map(|v| v - lse).collect()
}

/// vLLM's repetition penalty: each greedy token and its log-prob are those of the model's
/// logits with every token of the prompt and output so far penalized (divided by p when
/// positive, multiplied otherwise). Mutations that fail it: penalizing the output only,
/// multiplying positive logits, log-probs of the unpenalized logits.
#[tokio::test]
async fn repetition_penalty_shapes_greedy_tokens_and_their_logprobs() {
    let s = start(&[]).await;
    let engine = s.state.registry().model("tiny").unwrap().engine().clone();
    let prompt: Vec<u32> = (0..24)
        .map(|i| ((i * 7919 + 1179) % 5000 + 100) as u32)
        .collect();
    let p = 1.8f32;
    let ask = |pen: f32| {
        json!({"model": "tiny", "prompt": [prompt.clone()], "max_tokens": 12, "min_tokens": 12,
            "temperature": 0, "logprobs": 0, "return_token_ids": true, "repetition_penalty": pen})
    };
    let (code, body) = post(&s, "/v1/completions", ask(p)).await;
    assert_eq!(code, 200, "{body}");
    let (_, plain) = post(&s, "/v1/completions", ask(1.0)).await;
    let tokens = ids(&body["choices"][0]["token_ids"]);
    assert_ne!(
        tokens,
        ids(&plain["choices"][0]["token_ids"]),
        "the penalty changes this greedy answer"
    );
    let mut all = prompt.clone();
    all.extend(&tokens);
    let logits = engine.logits(all[..all.len() - 1].to_vec()).unwrap();
    for (i, &t) in tokens.iter().enumerate() {
        let mut row = logits[prompt.len() - 1 + i].clone();
        let mut seen: Vec<u32> = all[..prompt.len() + i].to_vec();
        seen.sort_unstable();
        seen.dedup();
        for &x in &seen {
            let v = &mut row[x as usize];
            *v = if *v > 0.0 { *v / p } else { *v * p };
        }
        let argmax = row
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
            .unwrap()
            .0;
        assert_eq!(t as usize, argmax, "token {i}");
        let got = body["choices"][0]["logprobs"]["token_logprobs"][i]
            .as_f64()
            .unwrap() as f32;
        let want = log_softmax(&row)[t as usize];
        assert!((got - want).abs() < 1e-4, "token {i}: {got} vs {want}");
    }
}

#[tokio::test]
async fn greedy_logprobs_are_the_log_softmax_of_the_models_logits() {
    let s = start(&[]).await;
    let engine = s.state.registry().model("tiny").unwrap().engine().clone();
    let prompt = vec![40u32, 41, 42, 43, 44, 45];
    let (code, body) = post(
        &s,
        "/v1/completions",
        json!({"model": "tiny", "prompt": [prompt], "max_tokens": 5, "min_tokens": 5,
            "temperature": 0, "logprobs": 3, "return_token_ids": true,
            "return_tokens_as_token_ids": true}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let c = &body["choices"][0];
    let tokens = ids(&c["token_ids"]);
    let lp = &c["logprobs"];
    let names: Vec<String> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let expected: Vec<String> = tokens.iter().map(|t| format!("token_id:{t}")).collect();
    assert_eq!(names, expected);
    // The reference: the logits of the prompt + generated tokens (what `policy-serve logits`
    // writes), position by position.
    let mut all = prompt.clone();
    all.extend(&tokens);
    let logits = engine.logits(all[..all.len() - 1].to_vec()).unwrap();
    for (i, &t) in tokens.iter().enumerate() {
        let reference = log_softmax(&logits[prompt.len() - 1 + i]);
        let got = lp["token_logprobs"][i].as_f64().unwrap() as f32;
        assert!(
            (got - reference[t as usize]).abs() < 1e-4,
            "token {i}: {got} vs {} (mutation: logprobs of the raw logits scaled wrongly)",
            reference[t as usize]
        );
        let top = lp["top_logprobs"][i].as_object().unwrap();
        // 3 alternatives; greedy's token is the first of them, so 3 entries in all.
        assert_eq!(top.len(), 3, "{top:?}");
        for (name, v) in top {
            let id: usize = name.trim_start_matches("token_id:").parse().unwrap();
            assert!((v.as_f64().unwrap() as f32 - reference[id]).abs() < 1e-4);
        }
        let mut sorted = reference.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kept: Vec<f32> = top.values().map(|v| v.as_f64().unwrap() as f32).collect();
        assert!(
            kept.iter().all(|v| *v >= sorted[2] - 1e-4),
            "the top 3, not others"
        );
    }
}

#[tokio::test]
async fn sampled_logprobs_are_those_of_the_cut_distribution() {
    let s = start(&[]).await;
    let (code, body) = post(
        &s,
        "/v1/completions",
        json!({"model": "tiny", "prompt": [varied_prompt()], "max_tokens": 8, "min_tokens": 8,
            "temperature": 1.5, "top_p": 1.0, "top_k": 5, "seed": 3, "logprobs": 5,
            "return_token_ids": true, "return_tokens_as_token_ids": true}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let lp = &body["choices"][0]["logprobs"];
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        // top-k 5 keeps 5 tokens: all of them listed, their probabilities summing to 1
        // (mutation: log-probs of the uncut distribution sum to less).
        assert_eq!(top.len(), 5);
        let mass: f64 = top.values().map(|v| v.as_f64().unwrap().exp()).sum();
        assert!((mass - 1.0).abs() < 1e-3, "position {i}: mass {mass}");
        let tok = lp["tokens"][i].as_str().unwrap();
        assert!(top.contains_key(tok), "the drawn token is one the cut kept");
    }
}

/// A request without `top_k` samples under the model's `generation_config.json` top-k (20
/// for Qwen3, as vLLM applies it), on completions and chat alike; `top_k` 0 or -1 turns it
/// off. Seeded draws say which: absent equals 20, and -1 differs from both at a temperature
/// that makes the tail likely. (Before: completions dropped the default, so `temperature`
/// alone sampled the whole vocabulary's top-p nucleus on the host, 0.5 s a token on an H200.)
#[tokio::test]
async fn a_request_without_top_k_takes_the_models_default() {
    let s = start(&[]).await;
    let draw = |top_k: Option<i64>, chat: bool| {
        let mut body = json!({"model": "tiny", "max_tokens": 12, "min_tokens": 12,
            "temperature": 2.0, "top_p": 1.0, "seed": 11, "return_token_ids": true});
        if chat {
            body["messages"] = json!([{"role": "user", "content": "Name three tables."}]);
        } else {
            body["prompt"] = json!([varied_prompt()]);
        }
        if let Some(k) = top_k {
            body["top_k"] = json!(k);
        }
        let path = if chat {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let s = &s;
        async move {
            let (code, body) = post(s, path, body).await;
            assert_eq!(code, 200, "{body}");
            ids(&body["choices"][0]["token_ids"])
        }
    };
    for chat in [false, true] {
        let absent = draw(None, chat).await;
        assert_eq!(
            absent,
            draw(Some(20), chat).await,
            "chat {chat}: absent is the default 20"
        );
        let off = draw(Some(-1), chat).await;
        assert_ne!(absent, off, "chat {chat}: -1 turns the default off");
        assert_eq!(off, draw(Some(0), chat).await, "chat {chat}: 0 is off too");
    }
}

#[tokio::test]
async fn min_p_keeps_only_tokens_near_the_most_likely_in_draws_and_logprobs() {
    let s = start(&[]).await;
    let (code, body) = post(
        &s,
        "/v1/completions",
        json!({"model": "tiny", "prompt": [varied_prompt()], "max_tokens": 8, "min_tokens": 8,
            "temperature": 1.5, "top_p": 1.0, "min_p": 0.3, "seed": 4, "logprobs": 5,
            "return_tokens_as_token_ids": true}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let lp = &body["choices"][0]["logprobs"];
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        let probs: Vec<f64> = top.values().map(|v| v.as_f64().unwrap().exp()).collect();
        let max = probs.iter().cloned().fold(0.0, f64::max);
        // Every token listed is one min-p kept: at least 0.3 x the most likely (mutation:
        // min-p ignored lists the tail of the top 5).
        assert!(
            probs.iter().all(|&p| p >= 0.3 * max - 1e-6),
            "position {i}: {top:?}"
        );
        let drawn = lp["tokens"][i].as_str().unwrap();
        assert!(top.contains_key(drawn));
        let mass: f64 = probs.iter().sum();
        assert!(mass <= 1.0 + 1e-4);
        if top.len() < 5 {
            assert!(
                (mass - 1.0).abs() < 1e-3,
                "all kept tokens listed: mass {mass}"
            );
        }
    }
}

#[tokio::test]
async fn bad_completion_fields_are_refused_naming_the_field() {
    let s = start(&[]).await;
    for (body, param) in [
        (
            json!({"model": "tiny", "prompt": [[1, 2]], "logprobs": 21}),
            "logprobs",
        ),
        (
            json!({"model": "tiny", "prompt": [[1, 2]], "min_p": 1.5}),
            "min_p",
        ),
        (
            json!({"model": "tiny", "prompt": [[1, 2]], "repetition_penalty": 0}),
            "repetition_penalty",
        ),
        (
            json!({"model": "tiny", "prompt": [[1, 2]], "repetition_penalty": "1.2"}),
            "repetition_penalty",
        ),
        (json!({"model": "tiny", "prompt": []}), "prompt"),
        (json!({"model": "tiny", "prompt": [[1, -2]]}), "prompt"),
        (json!({"model": "tiny", "prompt": [[1], "a"]}), "prompt"),
        (json!({"model": "tiny", "prompt": [[1, 2]], "n": 0}), "n"),
        (
            json!({"model": "tiny", "prompt": [[1, 2]], "top_k": -3}),
            "top_k",
        ),
        (
            json!({"model": "tiny", "prompt": [[1, 2]], "stream": true}),
            "stream",
        ),
        (json!({"model": "demo", "prompt": "hi"}), "model"),
    ] {
        let (code, r) = post(&s, "/v1/completions", body.clone()).await;
        assert_eq!(code, 400, "{body} -> {r}");
        assert_eq!(r["error"]["param"], param, "{body} -> {r}");
    }
    // A token id outside the vocabulary: refused before generation, the engine untouched.
    let (code, r) = post(
        &s,
        "/v1/completions",
        json!({"model": "tiny", "prompt": [[1, 4_000_000_000u64]]}),
    )
    .await;
    assert_eq!(code, 400, "{r}");
    // TRL's defaults are accepted: top_k 0, min_p 0, repetition_penalty 1, logprobs 0.
    let (code, r) = post(
        &s,
        "/v1/completions",
        json!({"model": "tiny", "prompt": [[1, 2]], "top_k": 0, "min_p": 0.0,
            "repetition_penalty": 1.0, "logprobs": 0, "max_tokens": 2}),
    )
    .await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(
        r["choices"][0]["logprobs"]["top_logprobs"][0]
            .as_object()
            .unwrap()
            .len(),
        1,
        "logprobs 0: the drawn token's only"
    );
}

#[tokio::test]
async fn world_size_and_prefix_cache_reset_answer_as_vllm_does() {
    let s = start(&[]).await;
    let r = reqwest::get(format!("{}/get_world_size", s.base))
        .await
        .unwrap();
    let code = r.status().as_u16();
    let world: Value = r.json().await.unwrap();
    assert_eq!(code, 200, "{world}");
    assert_eq!(world["world_size"], 1);
    let prompt: Vec<u32> = (0..40).map(|i| 500 + i).collect();
    let body = json!({"model": "tiny", "prompt": [prompt], "max_tokens": 1});
    let cached = |r: &Value| r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let (_, first) = post(&s, "/v1/completions", body.clone()).await;
    assert_eq!(cached(&first), Some(0));
    let (_, again) = post(&s, "/v1/completions", body.clone()).await;
    assert_eq!(cached(&again), Some(32), "two whole blocks from the cache");
    let (code, reset) = post(&s, "/reset_prefix_cache", json!({})).await;
    assert_eq!(code, 200, "{reset}");
    assert!(reset["freed_blocks"]["tiny"].as_u64().unwrap() >= 2);
    let (_, after) = post(&s, "/v1/completions", body).await;
    assert_eq!(cached(&after), Some(0), "nothing cached after the reset");
    let info: Value = reqwest::get(format!("{}/server_info", s.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["models"]["tiny"]["world_size"], 1);
}

#[tokio::test]
async fn chat_gives_n_choices_with_token_ids_and_logprobs_as_trl_reads_them() {
    let s = start(&[]).await;
    let messages = json!([{"role": "user", "content": "Count the rows of table t."}]);
    let (code, body) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": messages, "n": 3, "max_tokens": 6, "min_tokens": 6,
            "temperature": 1.5, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
            "repetition_penalty": 1.0, "seed": 5, "logprobs": true, "top_logprobs": 2,
            "return_token_ids": true, "return_tokens_as_token_ids": true}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    // The prompt's ids: the model's template rendered and tokenized, as the engine sees it.
    let model = s.state.registry().model("tiny").unwrap();
    let msgs = vec![policy_serve::Message::user("Count the rows of table t.")];
    let thinking = s.state.registry().spec("tiny").unwrap().enable_thinking;
    let rendered = model
        .template()
        .render(
            &msgs,
            None,
            policy_serve::RenderOptions {
                add_generation_prompt: true,
                enable_thinking: Some(thinking),
            },
        )
        .unwrap();
    let expected = model.engine().tokenize(&rendered).unwrap();
    assert_eq!(ids(&body["prompt_token_ids"]), expected);
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let toks = ids(&c["token_ids"]);
        assert_eq!(toks.len(), 6);
        let content = c["logprobs"]["content"].as_array().unwrap();
        assert_eq!(content.len(), 6);
        for (e, t) in content.iter().zip(&toks) {
            assert_eq!(e["token"], format!("token_id:{t}"));
            assert!(e["logprob"].as_f64().unwrap() <= 0.0);
            assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
        }
    }
    assert_eq!(body["usage"]["completion_tokens"], 18);
    // chat_template_kwargs reaches the template: the other thinking setting renders another
    // prompt, and the one with thinking off holds the empty think block.
    let (_, other) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": messages, "max_tokens": 1,
            "chat_template_kwargs": {"enable_thinking": !thinking}, "return_token_ids": true}),
    )
    .await;
    let other_ids = ids(&other["prompt_token_ids"]);
    assert_ne!(other_ids, expected);
    let off_ids = if thinking { &other_ids } else { &expected };
    let text = model.engine().tokenizer().decode(off_ids, false).unwrap();
    assert!(text.contains("</think>"), "{text}");
    // tool_choice "none" keeps the tools in the prompt (TRL sends them so), parsing nothing.
    let (_, with_tools) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": messages, "max_tokens": 1, "tools": super::tools(),
            "tool_choice": "none", "return_token_ids": true}),
    )
    .await;
    assert!(ids(&with_tools["prompt_token_ids"]).len() > expected.len() + 50);
}

/// A Python with TRL (pinned), transformers, requests and jinja2, in a venv under the test
/// binaries' temp dir (made once, kept between runs); `None` without `python3` outside CI.
fn trl_python() -> Option<std::path::PathBuf> {
    let has = |py: &std::path::Path, module: &str| {
        std::process::Command::new(py)
            .args(["-c", &format!("import {module}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    let system = std::path::Path::new("python3");
    if std::process::Command::new(system)
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs python3 for the TRL client test"
        );
        eprintln!("skipping the TRL client test: no python3 here (CI runs it)");
        return None;
    }
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("trl-venv");
    let py = venv.join("bin/python");
    if !(has(&py, "trl") && has(&py, "transformers") && has(&py, "jinja2")) {
        let run = |cmd: &mut std::process::Command, what: &str| {
            let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                out.status.success(),
                "{what} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(
            std::process::Command::new(system)
                .args(["-m", "venv"])
                .arg(&venv),
            "python3 -m venv",
        );
        // TRL without its dependencies (torch, accelerate, datasets): its HTTP client uses
        // requests alone; the test stubs the rest.
        run(
            std::process::Command::new(&py).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "trl==1.16.0",
            ]),
            "pip install trl",
        );
        run(
            std::process::Command::new(&py).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "transformers>=5,<6",
                "requests",
                "jinja2",
                "packaging",
            ]),
            "pip install transformers requests jinja2",
        );
    }
    Some(py)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trls_own_vllm_client_drives_generation() {
    let Some(py) = tokio::task::spawn_blocking(trl_python).await.unwrap() else {
        return;
    };
    // Only the model: TRL takes the first model `/v1/models` lists.
    let s = start(&["--models", "tiny", "--max-tokens-cap", "512"]).await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/trl_client.py");
    let (base, dir) = (s.base.clone(), crate::common::shared_tiny_model());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(py)
            .arg(script)
            .arg(base)
            .arg(dir)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("trl client ok"),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
