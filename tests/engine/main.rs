//! The engine on the CPU with a tiny random Qwen3 checkpoint in the real layout: logits equal
//! candle-transformers' `qwen3`, batching changes no greedy token, concurrency, seeds, limits.

#[path = "../common/mod.rs"]
mod common;
mod constrained;
mod draft_model;
mod kv_fp8;
mod limits;
mod lora;
mod lora_keys;
mod masks;
mod speculative;
mod tiers;
mod transfer;
mod weights;

use common::prompt;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::qwen3;
use policy_serve::engine::{DeviceChoice, FinishReason, KvBudget};
use policy_serve::{
    EngineOptions, Error, GenerationRequest, ModelRegistry, ModelSpec, SamplingParams,
};

/// The tests' engine: the CPU, plain decoding (speculation, on by default, is what
/// `speculative.rs` and `draft_model.rs` turn on and compare against this).
pub(crate) fn options() -> EngineOptions {
    EngineOptions {
        device: DeviceChoice::Cpu,
        speculative: None,
        ..EngineOptions::default()
    }
}

pub(crate) fn registry_with(opts: EngineOptions) -> ModelRegistry {
    common::tiny_registry(opts)
}

/// Reference logits of every position from candle-transformers' qwen3 on the same checkpoint.
pub(crate) fn reference_logits(tokens: &[u32]) -> Vec<Vec<f32>> {
    let dir = common::shared_tiny_model();
    let cfg: qwen3::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let files = [dir.join("model.safetensors")];
    // SAFETY: the test owns the file and does not modify it while mapped.
    let vb =
        unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &Device::Cpu).unwrap() };
    let embed = vb
        .get(
            (cfg.vocab_size, cfg.hidden_size),
            "model.embed_tokens.weight",
        )
        .unwrap();
    let mut model = qwen3::Model::new(&cfg, vb).unwrap();
    let input = Tensor::new(tokens, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let hidden = model.forward(&input, 0).unwrap().squeeze(0).unwrap();
    hidden
        .matmul(&embed.t().unwrap())
        .unwrap()
        .to_vec2()
        .unwrap()
}

/// Reference step-by-step decode: feed the tokens one at a time through the contiguous cache.
pub(crate) fn reference_decode_logits(tokens: &[u32]) -> Vec<Vec<f32>> {
    let dir = common::shared_tiny_model();
    let cfg: qwen3::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let files = [dir.join("model.safetensors")];
    // SAFETY: as above.
    let vb =
        unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &Device::Cpu).unwrap() };
    let mut model = qwen3::ModelForCausalLM::new(&cfg, vb).unwrap();
    tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let input = Tensor::new(&[t], &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            model
                .forward(&input, i)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        })
        .collect()
}

/// The largest absolute difference between two sets of logits rows.
pub(crate) fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub(crate) fn max_rel_err(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0f32;
    for (ra, rb) in a.iter().zip(b) {
        let scale = rb.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        for (x, y) in ra.iter().zip(rb) {
            worst = worst.max((x - y).abs() / scale);
        }
    }
    worst
}

#[test]
fn prefill_logits_equal_candle_transformers_qwen3() {
    let r = registry_with(options());
    let engine = r.model("tiny").unwrap().engine().clone();
    let tokens = prompt(37, 1);
    let ours = engine.logits(tokens.clone()).unwrap();
    let theirs = reference_logits(&tokens);
    let err = max_rel_err(&ours, &theirs);
    assert!(err <= 1e-4, "relative error {err}");
    // Positive control: a different prompt gives different logits.
    let other = reference_logits(&prompt(37, 2));
    assert!(max_rel_err(&ours, &other) > 1e-2);
}

#[test]
fn chunked_prefill_and_step_by_step_decode_logits_equal_candle_transformers() {
    let opts = EngineOptions {
        prefill_chunk: 5,
        ..options()
    };
    let r = registry_with(opts);
    let engine = r.model("tiny").unwrap().engine().clone();
    let tokens = prompt(23, 3);
    let ours = engine.logits(tokens.clone()).unwrap();
    let theirs = reference_decode_logits(&tokens);
    let err = max_rel_err(&ours, &theirs);
    assert!(err <= 1e-4, "relative error {err}");
}

/// A prompt of 400 tokens (25 KV blocks of 16) prefilled in chunks of 48 (each attending to
/// its cached prefix through the block table) and in one chunk: the same logits at every
/// position. Mutation: a chunk that misses part of its cached prefix, or reads it from the
/// wrong slots, changes the logits of every later position.
#[test]
fn long_prompt_prefilled_in_chunks_or_whole_gives_equal_logits() {
    let tokens = prompt(400, 12);
    let logits = |chunk: usize| {
        let opts = EngineOptions {
            prefill_chunk: chunk,
            ..options()
        };
        let r = registry_with(opts);
        let engine = r.model("tiny").unwrap().engine().clone();
        engine.logits(tokens.clone()).unwrap()
    };
    let (chunked, whole) = (logits(48), logits(2048));
    assert_eq!(chunked.len(), 400);
    let err = max_rel_err(&chunked, &whole);
    assert!(err <= 1e-5, "relative error {err}");
    // Positive control: another prompt of the same length gives other logits.
    let r = registry_with(options());
    let other = r
        .model("tiny")
        .unwrap()
        .engine()
        .logits(prompt(400, 13))
        .unwrap();
    assert!(max_rel_err(&whole, &other) > 1e-2);
}

/// A prompt that shares its first 600 tokens (37 full blocks) with an earlier one reuses them
/// from the prefix cache and prefills only its tail in chunks over that cached prefix; its
/// greedy tokens equal those of an engine without the cache. Mutation: a tail chunk placed at
/// the wrong positions or slots after a cache hit changes the tokens.
#[test]
fn long_prompt_over_a_cached_prefix_gives_the_tokens_of_no_cache() {
    let first = prompt(700, 21);
    let mut second = first[..600].to_vec();
    second.extend(prompt(130, 22));
    let greedy = |prefix_cache: bool| {
        let opts = EngineOptions {
            prefix_cache,
            prefill_chunk: 64,
            ..options()
        };
        let r = registry_with(opts);
        let engine = r.model("tiny").unwrap().engine().clone();
        let req = |p: &[u32]| {
            let mut r = GenerationRequest::new(p.to_vec()).max_new_tokens(8);
            r.ignore_eos = true;
            r
        };
        engine.generate(req(&first)).unwrap();
        let g = engine.generate(req(&second)).unwrap();
        (g.tokens, g.cached_prompt_tokens)
    };
    let (cached, hit) = greedy(true);
    let (plain, no_hit) = greedy(false);
    assert!(
        hit >= 592,
        "the shared blocks came from the cache ({hit} tokens)"
    );
    assert_eq!(no_hit, 0);
    assert_eq!(cached, plain);
}

#[test]
fn greedy_generation_follows_the_reference_argmax() {
    let r = registry_with(options());
    let engine = r.model("tiny").unwrap().engine().clone();
    let p = prompt(11, 4);
    let g = engine
        .generate(GenerationRequest::new(p.clone()).max_new_tokens(6))
        .unwrap();
    assert_eq!(g.prompt_tokens, 11);
    let mut seq = p.clone();
    for &t in &g.tokens {
        let logits = reference_logits(&seq);
        let last = logits.last().unwrap();
        let argmax = last
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as u32;
        assert_eq!(t, argmax);
        seq.push(t);
    }
}

#[test]
fn eight_sequences_batched_give_the_same_greedy_tokens_as_each_alone() {
    let r = registry_with(options());
    let engine = r.model("tiny").unwrap().engine().clone();
    let prompts: Vec<Vec<u32>> = (0..8).map(|i| prompt(5 + i * 9, i as u32 + 10)).collect();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            engine
                .generate(GenerationRequest::new(p.clone()).max_new_tokens(12))
                .unwrap()
                .tokens
        })
        .collect();
    let pending: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(GenerationRequest::new(p.clone()).max_new_tokens(12)))
        .collect();
    let batched: Vec<Vec<u32>> = pending
        .into_iter()
        .map(|p| p.wait().unwrap().tokens)
        .collect();
    assert_eq!(alone, batched);
    assert!(engine.stats().steps > 0);
}

#[test]
fn requests_arriving_mid_generation_change_nothing() {
    let r = registry_with(options());
    let engine = r.model("tiny").unwrap().engine().clone();
    let long = prompt(30, 20);
    let want = engine
        .generate(GenerationRequest::new(long.clone()).max_new_tokens(40))
        .unwrap()
        .tokens;
    let first = engine.submit(GenerationRequest::new(long).max_new_tokens(40));
    std::thread::sleep(std::time::Duration::from_millis(5));
    let late: Vec<_> = (0..4)
        .map(|i| {
            engine.submit(GenerationRequest::new(prompt(20 + i, 30 + i as u32)).max_new_tokens(8))
        })
        .collect();
    assert_eq!(first.wait().unwrap().tokens, want);
    for p in late {
        assert_eq!(p.wait().unwrap().generated_tokens, 8);
    }
}

/// `Engine::submit_batch`: eight requests of 12 tokens start together (one prefill step, then
/// a decode step a token for all of them: 12 steps in all) and give the tokens each gives
/// alone; an empty prompt among them fails alone. Fails if a bad request fails the batch,
/// if the pendings come back in another order, or if the batch's requests are admitted in
/// different steps (more than 12). (Sending the requests one by one passes here: the
/// scheduler drains them in one pass in practice; the batch makes that a guarantee.)
#[test]
fn a_batch_submitted_together_runs_in_the_same_steps_and_a_bad_request_fails_alone() {
    let r = registry_with(options());
    let engine = r.model("tiny").unwrap().engine().clone();
    let prompts: Vec<Vec<u32>> = (0..8).map(|i| prompt(5 + i * 9, i as u32 + 40)).collect();
    let request = |p: &Vec<u32>| {
        let mut q = GenerationRequest::new(p.clone()).max_new_tokens(12);
        q.ignore_eos = true;
        q
    };
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| engine.generate(request(p)).unwrap().tokens)
        .collect();
    let before = engine.stats().steps;
    let mut batch: Vec<GenerationRequest> = prompts.iter().map(request).collect();
    batch.insert(3, GenerationRequest::new(vec![]).max_new_tokens(4));
    let mut pending = engine.submit_batch(batch);
    let empty = pending.remove(3).wait().unwrap_err();
    assert!(empty.to_string().contains("empty"), "{empty}");
    let batched: Vec<Vec<u32>> = pending
        .into_iter()
        .map(|p| p.wait().unwrap().tokens)
        .collect();
    assert_eq!(batched, alone);
    assert_eq!(
        engine.stats().steps - before,
        12,
        "the batch's eight requests should prefill in one step and decode together"
    );
}

#[test]
fn thirty_two_threads_generating_at_once_all_finish() {
    let r = Arc::new(registry_with(options()));
    let engine = r.model("tiny").unwrap().engine().clone();
    let handles: Vec<_> = (0..32)
        .map(|i| {
            let e = engine.clone();
            std::thread::spawn(move || {
                e.generate(GenerationRequest::new(prompt(3 + i % 7, i as u32)).max_new_tokens(5))
            })
        })
        .collect();
    for h in handles {
        let g = h.join().unwrap().unwrap();
        assert_eq!(
            (g.generated_tokens, g.finish_reason),
            (5, FinishReason::Length)
        );
    }
    assert_eq!(engine.stats().requests_finished, 32);
}

#[test]
fn same_seed_same_sample_and_another_seed_differs() {
    let r = registry_with(options());
    let engine = r.model("tiny").unwrap().engine().clone();
    let req = |seed| {
        GenerationRequest::new(prompt(9, 50))
            .max_new_tokens(16)
            .sampling(SamplingParams {
                temperature: 1.5,
                top_k: Some(50),
                top_p: Some(0.95),
                min_p: None,
                seed,
            })
    };
    let a = engine.generate(req(1)).unwrap().tokens;
    // Sampled in a batch with others: the seed alone decides.
    let noise: Vec<_> = (0..3).map(|i| engine.submit(req(100 + i))).collect();
    let b = engine.generate(req(1)).unwrap().tokens;
    let c = engine.generate(req(2)).unwrap().tokens;
    noise.into_iter().for_each(|p| drop(p.wait()));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn stop_strings_and_eos_end_generation() {
    let r = registry_with(options());
    let model = r.model("tiny").unwrap();
    let engine = model.engine().clone();
    let free = engine
        .generate(GenerationRequest::new(prompt(8, 60)).max_new_tokens(10))
        .unwrap();
    // Use the text of the 3rd generated token as a stop string: generation stops there.
    let piece = engine
        .tokenizer()
        .decode(&free.tokens[2..3], false)
        .unwrap();
    if !piece.is_empty() {
        let mut req = GenerationRequest::new(prompt(8, 60)).max_new_tokens(10);
        req.stop = vec![piece.clone()];
        let g = engine.generate(req).unwrap();
        assert_eq!(g.finish_reason, FinishReason::Stop);
        assert!(g.generated_tokens <= 3);
        assert!(!g.text.contains(&piece));
    }
    assert!(
        model.eos_token_ids().contains(&151645),
        "<|im_end|> ends generation"
    );
}

#[test]
fn streamed_chunks_add_up_to_the_final_text_and_never_show_a_stop_string() {
    let r = registry_with(options());
    let engine = r.model("tiny").unwrap().engine().clone();
    let (pending, mut stream) =
        engine.submit_streaming(GenerationRequest::new(prompt(12, 120)).max_new_tokens(20));
    let mut chunks = Vec::new();
    while let Some(c) = stream.next_blocking() {
        chunks.push(c);
    }
    let g = pending.wait().unwrap();
    assert!(
        chunks.len() > 1,
        "text arrived in several chunks: {chunks:?}"
    );
    assert_eq!(chunks.concat(), g.text);

    // A stop string from the middle of that text: the chunks stop before it.
    let cut = g
        .text
        .char_indices()
        .map(|(i, _)| i)
        .find(|&i| i >= g.text.len() / 2)
        .unwrap();
    let stop: String = g.text[cut..].chars().take(3).collect();
    let mut req = GenerationRequest::new(prompt(12, 120)).max_new_tokens(20);
    req.stop = vec![stop.clone()];
    let (pending, mut stream) = engine.submit_streaming(req);
    let mut streamed = String::new();
    while let Some(c) = stream.next_blocking() {
        streamed.push_str(&c);
    }
    let g2 = pending.wait().unwrap();
    assert_eq!(streamed, g2.text);
    assert!(
        !streamed.contains(&stop),
        "{streamed:?} shows the stop string {stop:?}"
    );
}

#[test]
fn min_tokens_holds_off_stop_strings_and_ignore_eos_runs_to_the_cap() {
    let r = registry_with(options());
    let engine = r.model("tiny").unwrap().engine().clone();
    let free = engine
        .generate(GenerationRequest::new(prompt(12, 90)).max_new_tokens(20))
        .unwrap();
    // A stop string that the free-running text reaches early.
    let stop: String = free.text.chars().take(2).collect();
    assert!(!stop.is_empty(), "{free:?}");
    let mut req = GenerationRequest::new(prompt(12, 90)).max_new_tokens(20);
    req.stop = vec![stop.clone()];
    let early = engine.generate(req.clone()).unwrap();
    assert!(
        early.generated_tokens < 10,
        "positive control: the stop string ends it early"
    );
    req.min_tokens = 10;
    let held = engine.generate(req.clone()).unwrap();
    assert!(held.generated_tokens >= 10, "{held:?}");
    req.min_tokens = 30;
    assert!(
        engine.generate(req).is_err(),
        "min_tokens over the cap is refused"
    );
    let mut all = GenerationRequest::new(prompt(12, 91)).max_new_tokens(16);
    all.ignore_eos = true;
    assert_eq!(engine.generate(all).unwrap().generated_tokens, 16);
}
