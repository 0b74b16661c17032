//! Speculative decoding with a draft model (`SpeculativeMethod::Draft`,
//! `EngineOptions::speculative_model`): answers equal plain decoding, greedy and seeded, with
//! the target itself drafting (every draft right) and with another model drafting (most
//! drafts wrong); its KV blocks come back when sequences end; a draft model that cannot serve
//! is refused at load, naming the files.

use policy_serve::engine::{SpeculativeMethod, SpeculativeOptions};

use super::*;

fn with_draft(dir: std::path::PathBuf, blocks: Option<usize>) -> EngineOptions {
    EngineOptions {
        speculative: Some(SpeculativeOptions {
            method: SpeculativeMethod::Draft,
            max_batch: 16,
            backoff: false,
            ..SpeculativeOptions::default()
        }),
        speculative_model: Some(dir),
        kv_budget: KvBudget {
            blocks,
            ..KvBudget::default()
        },
        ..options()
    }
}

fn run(
    opts: EngineOptions,
    reqs: &[GenerationRequest],
) -> (Vec<Vec<u32>>, policy_serve::engine::EngineStats) {
    let r = registry_with(opts);
    let engine = r.model("tiny").unwrap().engine().clone();
    let pending: Vec<_> = reqs.iter().map(|q| engine.submit(q.clone())).collect();
    let out = pending
        .into_iter()
        .map(|p| p.wait().unwrap().tokens)
        .collect();
    (out, engine.stats())
}

fn requests() -> Vec<GenerationRequest> {
    let mut reqs: Vec<GenerationRequest> = (0..4)
        .map(|i| GenerationRequest::new(prompt(10 + 3 * i as usize, 300 + i)).max_new_tokens(20))
        .collect();
    for (i, t) in [(4u32, 0.7f32), (5, 1.0)] {
        reqs.push(
            GenerationRequest::new(prompt(14, 300 + i))
                .max_new_tokens(20)
                .sampling(SamplingParams {
                    temperature: t,
                    seed: 40 + i as u64,
                    ..SamplingParams::greedy()
                }),
        );
    }
    reqs
}

/// The target drafting for itself: every draft is the target's own choice (kept), and the
/// answers, greedy and seeded, equal plain decoding's. Mutations that fail it: a draft KV
/// not cut back after a verify (`DraftKv::keep`: later drafts from a stale context would be
/// dropped), drafts made from the draft model's KV one position short, drafts made one
/// sequence at a time (K forwards a sequence, not K a step).
#[test]
fn the_target_drafting_for_itself_keeps_every_greedy_draft_and_changes_no_answer() {
    let reqs = requests();
    let (plain, _) = run(options(), &reqs);
    let (drafted, st) = run(with_draft(common::shared_tiny_model(), None), &reqs);
    assert_eq!(drafted, plain);
    assert!(st.spec_draft_tokens > 0, "{st:?}");
    // The four greedy requests alone: every draft kept.
    let (greedy, st) = run(with_draft(common::shared_tiny_model(), None), &reqs[..4]);
    assert_eq!(greedy, plain[..4].to_vec());
    assert_eq!(st.spec_accepted_tokens, st.spec_draft_tokens, "{st:?}");
    assert!(st.spec_mean_accepted_length().unwrap() > 4.0, "{st:?}");
    // The four draft together: a step's K drafts take K forwards of the draft model for all
    // of them (about one a verifying sequence-step), not K a sequence (four).
    assert!(
        st.spec_draft_forwards < 2 * st.spec_verify_steps,
        "{} draft forwards for {} verifies",
        st.spec_draft_forwards,
        st.spec_verify_steps
    );
}

/// Another model drafting (a tiny model of another seed, same tokenizer): most drafts are
/// wrong, the answers are still plain decoding's; a pool of 20 blocks for 6 sequences of up
/// to 3 blocks each runs three rounds, each drafting as much as the first (blocks come back
/// when sequences end: a leak of one round's 18 blocks would leave the next without drafts).
#[test]
fn another_model_drafting_changes_no_answer_and_returns_its_blocks() {
    let other = common::cached_model("draft-seed-9", &common::tiny_config(), 9);
    let reqs = requests();
    let (plain, _) = run(options(), &reqs);
    let r = registry_with(with_draft(other, Some(20)));
    let engine = r.model("tiny").unwrap().engine().clone();
    let (mut last, mut first_round) = (0, None);
    for round in 0..3 {
        let pending: Vec<_> = reqs.iter().map(|q| engine.submit(q.clone())).collect();
        let out: Vec<Vec<u32>> = pending
            .into_iter()
            .map(|p| p.wait().unwrap().tokens)
            .collect();
        assert_eq!(out, plain, "round {round}");
        let st = engine.stats();
        let drafted = st.spec_draft_tokens - last;
        let first = *first_round.get_or_insert(drafted);
        assert!(
            drafted > 0 && 2 * drafted >= first,
            "round {round} drafted {drafted}: {st:?}"
        );
        last = st.spec_draft_tokens;
        assert!(st.spec_accepted_tokens < st.spec_draft_tokens, "{st:?}");
    }
}

/// Refused at load, naming what is wrong: no `speculative_model`, a draft directory whose
/// tokenizer differs (both files named), a directory without weights.
#[test]
fn a_draft_model_that_cannot_serve_is_refused_at_load() {
    let err = |opts: EngineOptions| -> String {
        match registry_with(opts).model("tiny") {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    };
    let mut none = with_draft(common::shared_tiny_model(), None);
    none.speculative_model = None;
    assert!(err(none).contains("--speculative-model"));
    let odd = tempfile::tempdir().unwrap();
    let dir = common::write_tiny_model(odd.path(), 3);
    let tok = dir.join("tokenizer.json");
    let mut text = std::fs::read_to_string(&tok).unwrap();
    text.push(' ');
    std::fs::write(&tok, text).unwrap();
    let e = err(with_draft(dir.clone(), None));
    assert!(
        e.contains("vocabulary") && e.contains(&tok.display().to_string()),
        "{e}"
    );
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let e = err(with_draft(dir, None));
    assert!(e.contains("safetensors") || e.contains("weights"), "{e}");
}
