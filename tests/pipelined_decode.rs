//! Pipelined decode (`EngineOptions::pipelined_decode`): each decode step is launched before
//! the previous step's tokens are read, fed with them where the model runs. It must
//! give every request the tokens, text and finish reason of unpipelined decode: when a token
//! ends a sequence (EOS, a stop string, the token cap) the step already launched behind it,
//! when requests arrive or go away mid-run, and when sampled requests share the batch.

mod common;

use std::path::{Path, PathBuf};

use common::prompt;
use policy_serve::engine::{DeviceChoice, Generation};
use policy_serve::{EngineOptions, GenerationRequest, ModelRegistry, ModelSpec, SamplingParams};

fn engine(dir: &Path, pipelined: bool) -> (ModelRegistry, policy_serve::Engine) {
    let r = ModelRegistry::new(vec![ModelSpec::local("tiny", "Tiny", dir.to_path_buf())])
        .unwrap()
        .with_options(EngineOptions {
            device: DeviceChoice::Cpu,
            pipelined_decode: pipelined,
            // Pipelining is what is tested: speculation (on by default) pauses it at small batches.
            speculative: None,
            ..EngineOptions::default()
        });
    let e = r.model("tiny").unwrap().engine().clone();
    (r, e)
}

fn request(i: usize) -> GenerationRequest {
    GenerationRequest::new(prompt(5 + 2 * i, 900 + i as u32)).max_new_tokens(3 + 4 * i)
}

/// The context-sensitive model with one more EOS token: one that greedy decode of
/// `request(2)` first draws mid-answer (other requests may draw it too), so sequences end on
/// EOS at several steps.
fn model_with_eos_mid_answer(tmp: &tempfile::TempDir) -> (PathBuf, u32) {
    let dir = context_sensitive_model(tmp.path());
    let (_r, e) = engine(&dir, false);
    // Within request(2)'s own cap, so that request ends on it.
    let mut r = request(2);
    r.ignore_eos = true;
    let g = e.generate(r).unwrap();
    let eos = (2..g.tokens.len())
        .map(|i| g.tokens[i])
        .find(|t| !g.tokens[..2].contains(t))
        .expect("a token first drawn mid-answer");
    let gen_cfg = serde_json::json!({"eos_token_id": [eos, 151645], "do_sample": false});
    std::fs::write(dir.join("generation_config.json"), gen_cfg.to_string()).unwrap();
    (dir, eos)
}

fn run_all(e: &policy_serve::Engine, requests: Vec<GenerationRequest>) -> Vec<Generation> {
    let pending: Vec<_> = requests.into_iter().map(|r| e.submit(r)).collect();
    pending.into_iter().map(|p| p.wait().unwrap()).collect()
}

fn same(a: &[Generation], b: &[Generation]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.tokens, y.tokens, "request {i}: tokens");
        assert_eq!(x.text, y.text, "request {i}: text");
        assert_eq!(
            x.finish_reason, y.finish_reason,
            "request {i}: finish reason"
        );
    }
}

/// A tiny model whose greedy answers depend on the whole context (the shared tiny model
/// repeats one token, which would hide a token fed at the wrong position): its own lm_head,
/// and attention outputs scaled up so that they, not the current token's embedding, decide
/// the next token.
fn context_sensitive_model(dir: &Path) -> PathBuf {
    let mut cfg = common::tiny_config();
    cfg["tie_word_embeddings"] = serde_json::json!(false);
    let mut tensors = common::random_tensors(&cfg, 11);
    // An lm_head of its own, deterministic: the embedding with its columns rotated.
    let embed = &tensors["model.embed_tokens.weight"];
    let h = embed.dim(1).unwrap();
    let lm_head = candle_core::Tensor::cat(
        &[
            embed.narrow(1, 5, h - 5).unwrap(),
            embed.narrow(1, 0, 5).unwrap(),
        ],
        1,
    )
    .unwrap();
    tensors.insert("lm_head.weight".into(), (lm_head * 0.5).unwrap());
    for (name, t) in tensors.iter_mut() {
        if name.ends_with("v_proj.weight") || name.ends_with("o_proj.weight") {
            *t = (&*t * SCALE).unwrap();
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(common::fixtures().join("qwen3").join(f), dir.join(f)).unwrap();
    }
    dir.to_path_buf()
}

const SCALE: f64 = 4.0;

#[test]
fn pipelined_decode_gives_the_tokens_of_unpipelined_decode_when_tokens_end_sequences() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, eos) = model_with_eos_mid_answer(&tmp);
    let (_r0, plain) = engine(&dir, false);
    let (_r1, piped) = engine(&dir, true);
    // A stop string from the middle of one answer (found without it).
    let mut probe = request(5);
    probe.ignore_eos = true;
    let text = plain.generate(probe).unwrap().text;
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let requests = || {
        (0..8)
            .map(|i| {
                let mut r = request(i);
                if i == 5 {
                    r.ignore_eos = true;
                    r.stop = vec![stop.clone()];
                }
                if i == 6 {
                    r.min_tokens = 4;
                }
                r
            })
            .collect::<Vec<_>>()
    };
    let want = run_all(&plain, requests());
    let got = run_all(&piped, requests());
    same(&got, &want);
    // The runs hit each way a token can end a sequence behind a launched step.
    let reasons: Vec<_> = want
        .iter()
        .map(|g| format!("{:?}", g.finish_reason))
        .collect();
    for r in ["Eos", "Stop", "Length"] {
        assert!(reasons.iter().any(|x| x == r), "no {r} among {reasons:?}");
    }
    assert!(
        want[2].tokens.len() > 2 && want[2].tokens.ends_with(&[eos]),
        "{:?}",
        want[2].tokens
    );
    assert_eq!(plain.stats().pipelined_steps, 0);
    assert!(
        piped.stats().pipelined_steps > 10,
        "steps launched ahead: {}",
        piped.stats().pipelined_steps
    );
    // One at a time too (batch of one: every step pipelined until the end).
    for i in [0, 3, 7] {
        same(
            &[piped.generate(request(i)).unwrap()],
            &[plain.generate(request(i)).unwrap()],
        );
    }
}

// While requests wait that cannot be admitted (every slot taken), decode stays pipelined.
// Mutation that fails it: settling whenever the waiting queue is not empty (the old rule:
// only the last wave, with nobody waiting, pipelines).
#[test]
fn decode_stays_pipelined_while_requests_wait_for_a_slot() {
    let dir = common::shared_tiny_model();
    let with = |pipelined: bool| {
        let r = ModelRegistry::new(vec![ModelSpec::local("tiny", "Tiny", dir.clone())])
            .unwrap()
            .with_options(EngineOptions {
                device: DeviceChoice::Cpu,
                pipelined_decode: pipelined,
                max_running: Some(2),
                // Pipelining is what is tested: speculation (on by default) pauses it at small batches.
                speculative: None,
                ..EngineOptions::default()
            });
        let e = r.model("tiny").unwrap().engine().clone();
        (r, e)
    };
    let requests = || {
        (0..6)
            .map(|i| {
                let mut r =
                    GenerationRequest::new(prompt(6 + i, 300 + i as u32)).max_new_tokens(12);
                r.ignore_eos = true;
                r
            })
            .collect::<Vec<_>>()
    };
    let (_r0, plain) = with(false);
    let (_r1, piped) = with(true);
    let want = run_all(&plain, requests());
    let got = run_all(&piped, requests());
    same(&got, &want);
    // Three waves of two requests, 11 decode steps each: all but the steps at a wave's
    // admission run pipelined (the old rule pipelined only the last wave's ~10).
    let s = piped.stats();
    assert!(s.pipelined_steps >= 20, "{s:?}");
}

#[test]
fn requests_arriving_leaving_and_sampling_mid_pipeline_change_no_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = context_sensitive_model(tmp.path());
    let (_r0, plain) = engine(&dir, false);
    let (_r1, piped) = engine(&dir, true);
    let long = |i: usize| {
        let mut r = request(i).max_new_tokens(40);
        r.ignore_eos = true;
        r
    };
    // Sampled requests draw their numbers in step order, pipelined or not (top_k 20: the
    // device draw where there are kernels; none: the host draw).
    let sampled = |i: usize| {
        let mut r = long(i).max_new_tokens(12);
        r.sampling = SamplingParams {
            temperature: 0.8,
            top_k: (i == 4).then_some(20),
            seed: 7 + i as u64,
            ..SamplingParams::greedy()
        };
        r
    };
    let want: Vec<Generation> = (0..4)
        .map(|i| plain.generate(long(i)).unwrap())
        .chain((4..6).map(|i| plain.generate(sampled(i)).unwrap()))
        .collect();
    // Two long requests decode pipelined; others arrive while they run, one streaming
    // request goes away after its first chunk, and sampled requests join the batch.
    let first: Vec<_> = (0..2).map(|i| piped.submit(long(i))).collect();
    let (gone, mut stream) = piped.submit_streaming(long(9));
    assert!(stream.next_blocking().is_some());
    drop((gone, stream));
    // It is dropped while the other two decode (pipelined), before anything else arrives.
    let t0 = std::time::Instant::now();
    while piped.stats().requests_cancelled == 0 {
        assert!(t0.elapsed().as_secs() < 60, "the request was never dropped");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let later: Vec<_> = (2..4)
        .map(|i| piped.submit(long(i)))
        .chain((4..6).map(|i| piped.submit(sampled(i))))
        .collect();
    let got: Vec<Generation> = first
        .into_iter()
        .chain(later)
        .map(|p| p.wait().unwrap())
        .collect();
    same(&got, &want);
    let s = piped.stats();
    assert!(s.pipelined_steps > 0, "{s:?}");
    assert_eq!(s.requests_cancelled, 1, "{s:?}");
    assert_eq!(s.blocks_free + s.cached_blocks, s.blocks_total, "{s:?}");
}

#[test]
fn pipelined_decode_under_kv_pressure_and_shared_prefixes_changes_no_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = context_sensitive_model(tmp.path());
    // Six requests sharing a 40-token prefix (cache hits), 24 tokens each, in a pool of 12
    // blocks of 16: too small for all of them, so sequences are preempted (swapped or
    // recomputed) and blocks for the next position are often not free to take ahead.
    let shared = prompt(40, 5);
    let requests = || {
        (0..6)
            .map(|i| {
                let mut p = shared.clone();
                p.extend(prompt(3 + i, 60 + i as u32));
                let mut r = GenerationRequest::new(p).max_new_tokens(24);
                r.ignore_eos = true;
                r
            })
            .collect::<Vec<_>>()
    };
    let want = run_all(&engine(&dir, false).1, requests());
    for kv_host_gib in [1.0, 0.0] {
        let r = ModelRegistry::new(vec![ModelSpec::local("tiny", "Tiny", dir.clone())])
            .unwrap()
            .with_options(EngineOptions {
                device: DeviceChoice::Cpu,
                pipelined_decode: true,
                kv_budget: policy_serve::engine::KvBudget {
                    blocks: Some(12),
                    ..Default::default()
                },
                kv_host_gib,
                // Pipelining is what is tested: speculation (on by default) pauses it at small batches.
                speculative: None,
                ..EngineOptions::default()
            });
        let e = r.model("tiny").unwrap().engine().clone();
        same(&run_all(&e, requests()), &want);
        let s = e.stats();
        assert!(s.preemptions > 0, "swap {kv_host_gib}: {s:?}");
        assert!(s.pipelined_steps > 0, "swap {kv_host_gib}: {s:?}");
        assert!(s.cache_hit_tokens > 0, "swap {kv_host_gib}: {s:?}");
        assert_eq!(s.blocks_free + s.cached_blocks, s.blocks_total, "{s:?}");
    }
}

/// xorshift64: the soak test's scenarios.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Random workloads (arrivals over time, callers leaving, stop strings, EOS, sampling, a
/// small KV pool), pipelined against unpipelined, all at once: every greedy request that stays
/// gets the same answer, none fails. Long; run with `POLICY_SERVE_SOAK_ROUNDS=N cargo test --release --test
/// pipelined_decode -- --ignored`.
#[test]
#[ignore = "soak test: minutes"]
fn soak_random_workloads_pipelined_equal_unpipelined() {
    let rounds: u64 = std::env::var("POLICY_SERVE_SOAK_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let tmp = tempfile::tempdir().unwrap();
    let (dir, _) = model_with_eos_mid_answer(&tmp);
    let (_r0, plain) = engine(&dir, false);
    let mut preempted = 0;
    for round in 0..rounds {
        let mut d = Draw(0x9E37_79B9_7F4A_7C15 ^ (round + 1));
        let n = 3 + d.below(8) as usize;
        let specs: Vec<(GenerationRequest, u64, bool)> = (0..n)
            .map(|i| {
                let len = 3 + d.below(28) as usize;
                let max_new = 1 + d.below(30) as usize;
                let mut r = GenerationRequest::new(prompt(len, (round * 100 + i as u64) as u32))
                    .max_new_tokens(max_new);
                r.ignore_eos = d.below(4) == 0;
                if d.below(3) == 0 {
                    r.stop = vec![["a", "e", " t", "in", "o"][d.below(5) as usize].to_string()];
                }
                r.min_tokens = (d.below(3) as usize).min(max_new);
                match d.below(4) {
                    0 | 1 => {}
                    k => {
                        r.sampling = SamplingParams {
                            temperature: 0.7,
                            top_k: (k == 2).then_some(20),
                            seed: d.below(1000),
                            ..SamplingParams::greedy()
                        }
                    }
                }
                (r, d.below(15), d.below(5) == 0)
            })
            .collect();
        let want = run_all(&plain, specs.iter().map(|s| s.0.clone()).collect());
        let greedy: Vec<bool> = specs.iter().map(|s| s.0.sampling.is_greedy()).collect();
        let caps: Vec<usize> = specs
            .iter()
            .map(|s| s.0.max_new_tokens.unwrap_or(0))
            .collect();
        let r = ModelRegistry::new(vec![ModelSpec::local("tiny", "Tiny", dir.clone())])
            .unwrap()
            .with_options(EngineOptions {
                device: DeviceChoice::Cpu,
                pipelined_decode: true,
                // Blocks of 4 tokens, 16-63 of them: a request takes up to 16, so sequences
                // are preempted and next blocks are often not free to take ahead.
                block_size: 4,
                kv_budget: policy_serve::engine::KvBudget {
                    blocks: Some(16 + d.below(48) as usize),
                    ..Default::default()
                },
                kv_host_gib: if d.below(2) == 0 { 0.0 } else { 1.0 },
                // Pipelining is what is tested: speculation (on by default) pauses it at small batches.
                speculative: None,
                ..EngineOptions::default()
            });
        let e = r.model("tiny").unwrap().engine().clone();
        let mut kept = Vec::new();
        for (i, (req, delay, leaves)) in specs.into_iter().enumerate() {
            std::thread::sleep(std::time::Duration::from_millis(delay));
            if leaves {
                let (p, mut s) = e.submit_streaming(req);
                if i % 2 == 0 {
                    let _ = s.next_blocking();
                }
                drop((p, s));
            } else {
                kept.push((i, e.submit(req)));
            }
        }
        for (i, p) in kept {
            let g = p.wait().unwrap();
            // Greedy answers must match. A sampled one may not, pipelined or not: the rows it
            // shares a step with differ when arrivals differ in time, and a draw over the whole
            // vocabulary can turn on the last bits of a logit (seen with pipelining off too).
            if greedy[i] {
                same(std::slice::from_ref(&g), std::slice::from_ref(&want[i]));
            } else {
                assert!(g.generated_tokens <= caps[i], "round {round}: {g:?}");
            }
        }
        let s = e.stats();
        assert_eq!(s.requests_failed, 0, "round {round}: {s:?}");
        preempted += s.preemptions;
        eprintln!(
            "round {round}: {n} requests, {} steps launched ahead, {} preemptions",
            s.pipelined_steps, s.preemptions
        );
    }
    assert!(preempted > 0, "the small pools never preempted");
}

/// Requests with whole-vocabulary log-probs (greedy and sampled, what RL trainers ask) run
/// pipelined: their log-probs travel with the ids, and equal unpipelined decode's, also for
/// sequences that end (EOS, the cap) behind a launched step; rows with a cut distribution
/// (top-k) keep stepping unpipelined. Mutations that fail it: attaching a row's log-prob to
/// the wrong sequence, keeping the log-prob of a dropped row (one too many).
#[test]
fn log_probs_travel_with_pipelined_steps_and_equal_unpipelined_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, _eos) = model_with_eos_mid_answer(&tmp);
    let (_r0, plain) = engine(&dir, false);
    let (_r1, piped) = engine(&dir, true);
    let requests = |top_k: Option<usize>| {
        (0..8)
            .map(|i| {
                let mut r = request(i);
                r.logprobs = Some(i % 3);
                if i % 2 == 1 {
                    r = r.sampling(SamplingParams {
                        temperature: 0.8,
                        top_k,
                        seed: 40 + i as u64,
                        ..SamplingParams::greedy()
                    });
                }
                r
            })
            .collect::<Vec<_>>()
    };
    let want = run_all(&plain, requests(None));
    let got = run_all(&piped, requests(None));
    same(&got, &want);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let (a, b) = (a.logprobs.as_ref().unwrap(), b.logprobs.as_ref().unwrap());
        assert_eq!(a.len(), b.len(), "request {i}: one log-prob a token");
        for (x, y) in a.iter().zip(b) {
            assert_eq!(
                (x.token, x.top.len()),
                (y.token, y.top.len()),
                "request {i}"
            );
            assert!((x.logprob - y.logprob).abs() < 1e-4, "request {i}");
            for ((t1, v1), (t2, v2)) in x.top.iter().zip(&y.top) {
                assert!(t1 == t2 && (v1 - v2).abs() < 1e-4, "request {i}");
            }
        }
    }
    let launched = piped.stats().pipelined_steps;
    assert!(launched > 5, "log-prob steps were pipelined: {launched}");
    // With top-k (a cut distribution) the sampled rows keep the batch unpipelined.
    let before = piped.stats().pipelined_steps;
    let got = run_all(&piped, requests(Some(5)));
    same(&got, &run_all(&plain, requests(Some(5))));
    assert_eq!(piped.stats().pipelined_steps, before);
}
