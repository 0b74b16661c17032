//! Speculative decoding with n-gram drafts (`EngineOptions::speculative`): greedy answers are
//! token for token those without it, alone and batched, with the cap, stop strings and EOS
//! falling inside a draft, prefix-cache hits and preemption; and drafts are actually made and
//! kept (the tests would pass vacuously otherwise).

use policy_serve::engine::SpeculativeOptions;

use super::*;

fn spec() -> EngineOptions {
    EngineOptions {
        speculative: Some(SpeculativeOptions {
            max_batch: 16,
            backoff: false,
            ..SpeculativeOptions::default()
        }),
        ..options()
    }
}

/// Prompts that repeat themselves (agent transcripts copy: tool arguments repeat names
/// from the prompt), so that n-gram drafts exist from the first step.
fn repetitive(i: u32) -> Vec<u32> {
    let unit = prompt(9, 700 + i);
    unit.iter()
        .chain(&unit)
        .chain(&unit[..5])
        .copied()
        .collect()
}

fn run(
    opts: EngineOptions,
    reqs: &[GenerationRequest],
) -> (
    Vec<policy_serve::Generation>,
    policy_serve::engine::EngineStats,
) {
    let r = registry_with(opts);
    let engine = r.model("tiny").unwrap().engine().clone();
    let pending: Vec<_> = reqs.iter().map(|q| engine.submit(q.clone())).collect();
    let out = pending.into_iter().map(|p| p.wait().unwrap()).collect();
    (out, engine.stats())
}

/// The same tokens and log-probs, to float noise (the batch around a row differs).
fn same_logprobs(
    a: &[policy_serve::engine::TokenLogprob],
    b: &[policy_serve::engine::TokenLogprob],
) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.token, y.token);
        assert!((x.logprob - y.logprob).abs() < 1e-4);
        for ((t1, v1), (t2, v2)) in x.top.iter().zip(&y.top) {
            assert!(t1 == t2 && (v1 - v2).abs() < 1e-3 * v1.abs().max(1.0));
        }
    }
}

fn tokens(g: &[policy_serve::Generation]) -> Vec<(Vec<u32>, FinishReason, String)> {
    g.iter()
        .map(|g| (g.tokens.clone(), g.finish_reason, g.text.clone()))
        .collect()
}

/// Mutations that fail it: keeping the first draft that differs from the model's choice,
/// counting the dropped drafts' KV as computed (later tokens see wrong context), skipping
/// the end checks between the tokens of one step.
#[test]
fn greedy_answers_equal_plain_decoding_alone_and_batched() {
    // The tiny model loops on a token t. A prompt that ends with "t t 11 12 13 14" makes the
    // draft after the model's first "t t" wrong (the prompt's continuation: the rejection
    // path) and the later ones right (the loop). t is found by iterating to a fixed point.
    let with = |i: u32, t: u32| {
        let mut p = repetitive(i);
        p.extend([t, t, 11, 12, 13, 14]);
        p
    };
    let mut reqs = Vec::new();
    for i in 0..5u32 {
        let mut t = run(
            options(),
            &[GenerationRequest::new(repetitive(i)).max_new_tokens(1)],
        )
        .0[0]
            .tokens[0];
        for _ in 0..4 {
            let out = run(
                options(),
                &[GenerationRequest::new(with(i, t)).max_new_tokens(2)],
            )
            .0;
            if out[0].tokens == [t, t] {
                reqs.push(GenerationRequest::new(with(i, t)).max_new_tokens(40));
                break;
            }
            t = out[0].tokens[1];
        }
    }
    assert!(
        reqs.len() >= 2,
        "prompts with a wrong first draft were found"
    );
    let (plain, _) = run(options(), &reqs);
    let (batched, stats) = run(spec(), &reqs);
    assert_eq!(tokens(&plain), tokens(&batched));
    assert!(stats.spec_draft_tokens > 0, "drafts were made: {stats:?}");
    assert!(stats.spec_accepted_tokens > 0, "some were kept: {stats:?}");
    assert!(
        stats.spec_accepted_tokens < stats.spec_draft_tokens,
        "some were dropped (the rejection path ran): {stats:?}"
    );
    // Every token beyond one a verify is an accepted draft; the counters say so.
    let mean = stats.spec_mean_accepted_length().unwrap();
    assert!(stats.spec_verify_steps > 0 && mean > 1.0, "{stats:?}");
    let plain_steps = plain.iter().map(|g| g.tokens.len()).sum::<usize>() as f64;
    assert!(
        stats.spec_verify_steps as f64 * mean <= plain_steps,
        "{stats:?}"
    );
    assert_eq!(stats.spec_paused_steps, 0, "max_batch 16 never pauses");
    for (i, q) in reqs.iter().enumerate() {
        let (alone, _) = run(spec(), std::slice::from_ref(q));
        assert_eq!(tokens(&alone), tokens(&plain[i..=i]), "request {i} alone");
    }
}

/// Sampled requests are drafted too: each verifying row draws with the uniform number of
/// its output position and a draft is kept when the draw equals it (rejection sampling of a
/// one-hot proposal), so a seeded request gives the tokens and log-probs it gives without
/// speculation, alone and batched with greedy ones, and twice the same. Mutations that fail
/// it: drawing every verifying row with the step's first number (`Rng::nth` of the row's
/// sequence position without its place), keeping a draft the draw did not confirm.
#[test]
fn sampled_answers_equal_plain_decoding_seed_for_seed() {
    let sampled = |i: u32, temperature: f32, top_k: Option<usize>, top_p: Option<f32>| {
        let mut r = GenerationRequest::new(repetitive(40 + i))
            .max_new_tokens(32)
            .sampling(SamplingParams {
                temperature,
                top_k,
                top_p,
                seed: 1000 + i as u64,
                ..SamplingParams::greedy()
            });
        r.logprobs = i.is_multiple_of(3).then_some(2);
        r
    };
    let mut reqs = Vec::new();
    for i in 0..9u32 {
        let t = [0.5, 1.0, 1.5][i as usize % 3];
        let (k, p) = [(None, None), (Some(8), None), (None, Some(0.9))][i as usize / 3];
        reqs.push(sampled(i, t, k, p));
    }
    let (plain, _) = run(options(), &reqs);
    let mut with_greedy = reqs.clone();
    with_greedy.push(GenerationRequest::new(repetitive(60)).max_new_tokens(32));
    let (sp, stats) = run(spec(), &with_greedy);
    assert_eq!(tokens(&plain), tokens(&sp[..reqs.len()]));
    for (p, q) in plain.iter().zip(&sp).filter(|(p, _)| p.logprobs.is_some()) {
        same_logprobs(p.logprobs.as_ref().unwrap(), q.logprobs.as_ref().unwrap());
    }
    let (again, _) = run(spec(), &with_greedy);
    assert_eq!(
        tokens(&again),
        tokens(&sp),
        "seeded requests repeat run to run"
    );
    for (i, q) in reqs.iter().enumerate().step_by(4) {
        let (alone, st) = run(spec(), std::slice::from_ref(q));
        let (plain_alone, _) = run(options(), std::slice::from_ref(q));
        assert_eq!(tokens(&alone), tokens(&plain_alone), "request {i} alone");
        assert!(st.spec_draft_tokens > 0, "request {i} was drafted: {st:?}");
    }
    // Sampled rows alone: drafts kept and drafts dropped (both paths of the sampler ran).
    let (_, st) = run(spec(), &reqs);
    assert!(
        st.spec_accepted_tokens > 0 && st.spec_accepted_tokens < st.spec_draft_tokens,
        "{st:?}"
    );
    assert!(stats.spec_accepted_tokens > 0, "{stats:?}");
    // Different outputs across seeds (the draws are not degenerate).
    let distinct: std::collections::HashSet<_> = plain.iter().map(|g| g.tokens.clone()).collect();
    assert!(distinct.len() > 3);
}

/// Every cap from 1 to 12 tokens, and stop strings taken from the plain answer's own text
/// (so they fall inside drafts), end where plain decoding ends.
#[test]
fn the_cap_and_stop_strings_inside_a_draft_end_where_plain_decoding_ends() {
    let base = GenerationRequest::new(repetitive(3));
    // Every third cap also asks for log-probs: one a kept token, also when the cap ends
    // the answer inside a draft.
    let mut reqs: Vec<GenerationRequest> = (1..=12)
        .map(|n| {
            let mut r = base.clone().max_new_tokens(n);
            r.logprobs = (n % 3 == 0).then_some(1);
            r
        })
        .collect();
    let (full, _) = run(options(), &[base.clone().max_new_tokens(30)]);
    let text: Vec<char> = full[0].text.chars().collect();
    // Stop strings that first complete inside token k (k = 2..=14): the text from char 3 up
    // to two chars before the end of token k's text. The tiny model loops on a few tokens,
    // so most of those tokens arrive as kept drafts in the middle of a step.
    let r = registry_with(options());
    let tok = r.model("tiny").unwrap().engine().tokenizer().clone();
    for k in 2..=14 {
        let end = tok
            .decode(&full[0].tokens[..k], false)
            .unwrap()
            .chars()
            .count();
        let prev = tok
            .decode(&full[0].tokens[..k - 1], false)
            .unwrap()
            .chars()
            .count();
        if end >= prev + 3 && end - 2 > 3 && end <= text.len() {
            let stop: String = text[3..end - 2].iter().collect();
            let mut r = base.clone().max_new_tokens(30);
            r.stop = vec![stop];
            reqs.push(r);
        }
    }
    assert!(reqs.len() > 20, "stop strings were made");
    let mut min = base.clone().max_new_tokens(20);
    min.min_tokens = 7;
    reqs.push(min);
    let mut no_eos = base.clone().max_new_tokens(25);
    no_eos.ignore_eos = true;
    reqs.push(no_eos);
    let (plain, _) = run(options(), &reqs);
    let (sp, stats) = run(spec(), &reqs);
    for (i, (a, b)) in tokens(&plain).iter().zip(tokens(&sp)).enumerate() {
        assert_eq!(*a, b, "request {i}: {:?}", reqs[i].stop);
    }
    for (p, q) in plain.iter().zip(&sp).filter(|(p, _)| p.logprobs.is_some()) {
        let (x, y) = (p.logprobs.as_ref().unwrap(), q.logprobs.as_ref().unwrap());
        assert_eq!((x.len(), y.len()), (p.tokens.len(), q.tokens.len()));
        same_logprobs(x, y);
    }
    // The stop strings ended the answers early (else this would test nothing).
    assert!(
        plain[12..]
            .iter()
            .any(|g| g.finish_reason == FinishReason::Stop && g.generated_tokens > 3)
    );
    assert!(stats.spec_accepted_tokens > 0, "{stats:?}");
}

/// A second run of the same prompts hits the prefix cache (only verified tokens were
/// published); a pool of 10 blocks preempts (swap and recompute); both equal plain decoding.
#[test]
fn prefix_cache_hits_and_preemption_keep_the_answers() {
    let reqs: Vec<GenerationRequest> = (0..6)
        .map(|i| GenerationRequest::new(repetitive(10 + i)).max_new_tokens(24))
        .collect();
    let (plain, _) = run(options(), &reqs);
    let r = registry_with(spec());
    let engine = r.model("tiny").unwrap().engine().clone();
    for round in 0..2 {
        let out: Vec<_> = reqs
            .iter()
            .map(|q| engine.submit(q.clone()))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|p| p.wait().unwrap())
            .collect();
        assert_eq!(tokens(&out), tokens(&plain), "round {round}");
        if round == 1 {
            assert!(out.iter().all(|g| g.cached_prompt_tokens > 0));
        }
    }
    for kv_host_gib in [0.0, 1.0] {
        let tight = EngineOptions {
            kv_budget: KvBudget {
                blocks: Some(10),
                ..KvBudget::default()
            },
            kv_host_gib,
            ..spec()
        };
        let (out, stats) = run(tight, &reqs);
        assert_eq!(tokens(&out), tokens(&plain), "swap {kv_host_gib}");
        assert!(stats.preemptions > 0, "{stats:?}");
        assert_eq!(stats.blocks_free + stats.cached_blocks, stats.blocks_total);
    }
}

/// Requests with a repetition penalty are not drafted (they decode as before, in the same
/// steps as drafted ones); greedy requests with log-probs are, and get the log-prob of each
/// kept token from its verifying row; above `max_batch` running sequences nothing is drafted.
#[test]
fn ineligible_requests_and_big_batches_decode_as_before() {
    let mut reqs: Vec<GenerationRequest> = (0..3)
        .map(|i| GenerationRequest::new(repetitive(20 + i)).max_new_tokens(20))
        .collect();
    let mut lp = reqs[0].clone();
    lp.logprobs = Some(2);
    let mut pen = reqs[1].clone();
    pen.repetition_penalty = Some(1.3);
    let sampled = reqs[2].clone().sampling(SamplingParams {
        temperature: 0.9,
        seed: 3,
        ..SamplingParams::greedy()
    });
    reqs.extend([lp, pen, sampled]);
    let (plain, _) = run(options(), &reqs);
    let (sp, stats) = run(spec(), &reqs);
    assert_eq!(tokens(&plain), tokens(&sp));
    let (a, b) = (
        plain[3].logprobs.as_ref().unwrap(),
        sp[3].logprobs.as_ref().unwrap(),
    );
    same_logprobs(a, b);
    assert!(stats.spec_draft_tokens > 0);
    // The log-prob request alone: drafted, and the same log-probs.
    let (alone, st) = run(spec(), &reqs[3..4]);
    assert!(st.spec_accepted_tokens > 0, "{st:?}");
    let (a, b) = (
        alone[0].logprobs.as_ref().unwrap(),
        plain[3].logprobs.as_ref().unwrap(),
    );
    assert_eq!(a.len(), alone[0].tokens.len(), "one log-prob a kept token");
    same_logprobs(a, b);
    let small = EngineOptions {
        speculative: Some(SpeculativeOptions {
            max_batch: 2,
            ..SpeculativeOptions::default()
        }),
        ..options()
    };
    let six: Vec<GenerationRequest> = (0..6)
        .map(|i| GenerationRequest::new(repetitive(30 + i)).max_new_tokens(3))
        .collect();
    let pending_plain = run(options(), &six).0;
    let r = registry_with(small);
    let engine = r.model("tiny").unwrap().engine().clone();
    let pending: Vec<_> = six.iter().map(|q| engine.submit(q.clone())).collect();
    let out: Vec<_> = pending.into_iter().map(|p| p.wait().unwrap()).collect();
    assert_eq!(tokens(&out), tokens(&pending_plain));
    let st = engine.stats();
    assert!(
        st.spec_paused_steps > 0,
        "six running over max_batch 2: {st:?}"
    );
}

/// `n` greedy requests of `new` tokens (EOS ignored) on 12-token prompts salted from `salt`,
/// and their answers without speculation.
fn replay_setup(
    n: u32,
    salt: u32,
    new: usize,
) -> (Vec<GenerationRequest>, Vec<policy_serve::Generation>) {
    let reqs: Vec<GenerationRequest> = (0..n)
        .map(|i| {
            let mut r = GenerationRequest::new(prompt(12, salt + i)).max_new_tokens(new);
            r.ignore_eos = true;
            r
        })
        .collect();
    let (plain, _) = run(options(), &reqs);
    (reqs, plain)
}

/// `reqs` drafting from replays of their plain answers with a fraction `corrupt` of the
/// positions wrong (`None`: an empty replay, which drafts nothing).
fn replayed(
    reqs: &[GenerationRequest],
    plain: &[policy_serve::Generation],
    corrupt: Option<f64>,
) -> Vec<GenerationRequest> {
    reqs.iter()
        .zip(plain)
        .map(|(r, g)| {
            let mut r = r.clone();
            r.draft_replay = Some(std::sync::Arc::new(policy_serve::engine::DraftReplay {
                tokens: corrupt.map_or(Vec::new(), |_| g.tokens.clone()),
                corrupt: corrupt.unwrap_or(0.0),
            }));
            r
        })
        .collect()
}

/// The bench's replayed drafts (`DraftReplay`, hidden): the model's own continuation
/// replayed is always kept (K tokens a step), fully corrupted never is, and half corrupted
/// sits between; the answers equal plain decoding in every case, and an empty replay drafts
/// nothing (the bench's plain rows). Mutation that fails it: a proposer offset by one
/// position (it would draft the token after the one to verify).
#[test]
fn replayed_drafts_give_the_acceptance_asked_for() {
    let (reqs, plain) = replay_setup(3, 80, 24);
    let mut rates = Vec::new();
    for c in [Some(0.0), Some(0.5), Some(1.0), None] {
        let (out, st) = run(spec(), &replayed(&reqs, &plain, c));
        assert_eq!(tokens(&out), tokens(&plain), "corrupt {c:?}");
        rates.push(st.spec_accepted_tokens as f64 / st.spec_draft_tokens.max(1) as f64);
        if c.is_none() {
            assert_eq!(st.spec_draft_tokens, 0, "an empty replay drafts nothing");
        }
        if c == Some(0.0) {
            // After the prefill's token, each step verifies K = 4 drafts (fewer at the cap)
            // and keeps them all plus its own token: 23 tokens in ceil(23 / 5) = 5 steps.
            assert_eq!(st.spec_verify_steps, 3 * 5, "{st:?}");
            assert_eq!(st.spec_accepted_tokens + st.spec_verify_steps, 3 * 23);
        }
    }
    assert_eq!(rates[0], 1.0);
    assert!(rates[1] > 0.0 && rates[1] < 1.0, "{rates:?}");
    assert_eq!(rates[2], 0.0);
}

/// Options the engine cannot serve are refused at load, naming the option: K of 0 or above
/// 16, an n-gram range with MIN > MAX or MIN 0 (nothing is served half-configured).
#[test]
fn impossible_speculative_options_are_refused_at_load() {
    use policy_serve::engine::SpeculativeMethod;
    let bad = [
        (0, 2, 4, "num-speculative-tokens"),
        (17, 2, 4, "num-speculative-tokens"),
        (4, 5, 3, "speculative-ngram"),
        (4, 0, 3, "speculative-ngram"),
    ];
    for (k, min, max, named) in bad {
        let r = registry_with(EngineOptions {
            speculative: Some(SpeculativeOptions {
                method: SpeculativeMethod::Ngram { min, max },
                num_tokens: k,
                max_batch: 8,
                backoff: false,
            }),
            ..options()
        });
        let Err(e) = r.model("tiny") else {
            panic!("K {k} ngram {min},{max} was accepted")
        };
        let e = e.to_string();
        assert!(e.contains(named), "K {k} ngram {min},{max}: {e}");
    }
}

/// The backoff (`SpeculativeOptions::backoff`): fully wrong drafts are verified on fewer
/// steps (1, 3, 7, 15 plain steps after each failed verify in a row), right ones on every
/// step; the answers equal plain decoding either way. Mutation that fails it: the skip
/// counter never reset by a kept draft (the right drafts would be verified less often too).
#[test]
fn the_backoff_verifies_failing_drafts_less_often_and_changes_no_answer() {
    let (reqs, plain) = replay_setup(2, 90, 40);
    let backoff = |on: bool| EngineOptions {
        speculative: Some(SpeculativeOptions {
            max_batch: 16,
            backoff: on,
            ..SpeculativeOptions::default()
        }),
        ..options()
    };
    let (wrong_off, st_off) = run(backoff(false), &replayed(&reqs, &plain, Some(1.0)));
    let (wrong_on, st_on) = run(backoff(true), &replayed(&reqs, &plain, Some(1.0)));
    assert_eq!(tokens(&wrong_off), tokens(&plain));
    assert_eq!(tokens(&wrong_on), tokens(&plain));
    // Without the backoff each of the 39 steps after the prefill verifies but the last (no
    // room for a draft under the cap); with it, a sequence verifies at steps 1, 3, 7, 15, 31
    // (1, 3, 7, 15 plain steps between).
    assert_eq!(st_off.spec_verify_steps, 2 * 38, "{st_off:?}");
    assert_eq!(st_on.spec_verify_steps, 2 * 5, "{st_on:?}");
    let (right, st) = run(backoff(true), &replayed(&reqs, &plain, Some(0.0)));
    assert_eq!(tokens(&right), tokens(&plain));
    assert_eq!(st.spec_accepted_tokens, st.spec_draft_tokens, "{st:?}");
    // 39 tokens after the prefill's, 5 a verify: 8 verifies each, none skipped.
    assert_eq!(st.spec_verify_steps, 2 * 8, "{st:?}");
}

/// Speculation is on by default (n-gram drafts, K 4, the backoff, up to 8 running
/// sequences), for the library's `EngineOptions::default()` and for the flags alike: an
/// engine built with only its device chosen verifies drafts on self-repeating prompts and
/// answers as plain decoding does; `--speculative-method none` turns it off. Mutation that
/// fails it: the default left at `None` (no verify step).
#[test]
fn the_default_engine_speculates_and_answers_as_plain_decoding() {
    use clap::Parser;
    let reqs: Vec<GenerationRequest> = (0..3)
        .map(|i| GenerationRequest::new(repetitive(50 + i)).max_new_tokens(24))
        .collect();
    let (plain, _) = run(options(), &reqs);
    let defaults = EngineOptions {
        device: DeviceChoice::Cpu,
        ..EngineOptions::default()
    };
    assert_eq!(defaults.speculative, Some(SpeculativeOptions::default()));
    assert!(SpeculativeOptions::default().backoff);
    let (out, st) = run(defaults, &reqs);
    assert_eq!(tokens(&out), tokens(&plain));
    assert!(st.spec_verify_steps > 0, "{st:?}");
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: policy_serve::engine::EngineFlags,
    }
    let flags = |args: &[&str]| {
        let argv = std::iter::once("x").chain(args.iter().copied());
        Cli::try_parse_from(argv)
            .unwrap()
            .flags
            .options()
            .speculative
    };
    assert_eq!(flags(&[]), Some(SpeculativeOptions::default()));
    assert_eq!(flags(&["--speculative-method", "none"]), None);
    let no_backoff = flags(&["--speculative-backoff", "false"]).unwrap();
    assert!(!no_backoff.backoff);
    assert!(flags(&["--speculative-backoff"]).unwrap().backoff);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(10))]
    /// KV accounting under random acceptance: sequences draft from replays of their plain
    /// answers with a random fraction wrong (so each verify keeps a random count of drafts),
    /// K 1-6, in a pool of 8-16 blocks (blocks grown for drafts, then released when the
    /// drafts are rejected, under preemption). Every answer equals plain decoding and, once
    /// all are done, every block is free or cached: none is leaked or counted twice.
    /// Mutations that fail it: blocks grown for rejected drafts kept past the sequence's end,
    /// a draft's KV counted as computed.
    #[test]
    fn random_acceptance_keeps_the_block_counts(
        corrupt in 0.0f64..=1.0,
        k in 1usize..=6,
        n in 1u32..=4,
        new in 8usize..=28,
        blocks in 8usize..=16,
    ) {
        let (reqs, plain) = replay_setup(n, 200 + n * 7 + new as u32, new);
        let opts = EngineOptions {
            speculative: Some(SpeculativeOptions {
                num_tokens: k,
                max_batch: 16,
                backoff: false,
                ..SpeculativeOptions::default()
            }),
            kv_budget: KvBudget {
                blocks: Some(blocks),
                ..KvBudget::default()
            },
            ..options()
        };
        let (out, st) = run(opts, &replayed(&reqs, &plain, Some(corrupt)));
        proptest::prop_assert_eq!(tokens(&out), tokens(&plain));
        proptest::prop_assert!(st.spec_verify_steps > 0, "{:?}", st);
        proptest::prop_assert_eq!(st.blocks_free + st.cached_blocks, st.blocks_total, "{:?}", st);
    }
}
