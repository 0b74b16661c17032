//! `--spec-ks K,..`: speculative decoding's speed against its acceptance. Random weights
//! draft nothing useful, so each request's drafts are replayed from the model's own greedy
//! continuation (recorded by a plain run of the same prompts on an engine without
//! speculation, pipelined decode as configured) with a chosen fraction of positions corrupted
//! (`--spec-corrupt`); per K, batch and fraction: tok/s next to that plain decode, the
//! measured acceptance, the mean accepted length, the steps speculation paused for the batch
//! size, and whether the answers equal plain decoding.

use std::path::Path;
use std::sync::Arc;

use policy_serve::engine::{DraftReplay, SpeculativeMethod, SpeculativeOptions};
use policy_serve::{Engine, EngineOptions, ModelRegistry};

use crate::rows::decode_round;
use crate::{Args, engine_on};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One timed round of `b` requests ([`decode_round`]), request i drafting from `replay(i)`:
/// decode tok/s and the tokens.
fn round(
    engine: &Engine,
    a: &Args,
    b: usize,
    replay: &dyn Fn(usize) -> Option<Arc<DraftReplay>>,
) -> Res<(f64, Vec<Vec<u32>>)> {
    let r = decode_round(engine, a, b, &|q, i| q.draft_replay = replay(i))?;
    Ok((r.tps, r.gens.into_iter().map(|g| g.tokens).collect()))
}

/// The sweep: plain decode on an engine without speculation, then one engine per K
/// (`--spec-max-batch`), each dropped before the next.
pub(crate) fn spec_sweep(dir: &Path, opts: &EngineOptions, a: &Args) -> Res<()> {
    let engine_with = |speculative: Option<SpeculativeOptions>| -> Res<(ModelRegistry, Engine)> {
        let o = EngineOptions {
            speculative,
            speculative_model: a.spec_draft.clone(),
            ..opts.clone()
        };
        engine_on(dir, o)
    };
    let mut plain = Vec::new();
    {
        let (_registry, engine) = engine_with(None)?;
        for &b in &a.batches {
            plain.push(round(&engine, a, b, &|_| None)?);
        }
    }
    // Plain decode measured again after the sweep: the spread between the two is the
    // run's noise.
    let plain_again = |label: &str| -> Res<()> {
        let (_registry, engine) = engine_with(None)?;
        for (&b, (tps, _)) in a.batches.iter().zip(&plain) {
            let (again, _) = round(&engine, a, b, &|_| None)?;
            println!("# plain batch {b} {label}: {again:.0} tok/s (the table's {tps:.0})");
        }
        Ok(())
    };
    println!(
        "| K | batch | corrupt | tok/s | plain tok/s | x plain | acceptance | mean accepted length | paused steps | equal answers |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &k in &a.spec_ks {
        let (_registry, engine) = engine_with(Some(SpeculativeOptions {
            num_tokens: k,
            max_batch: a.spec_max_batch,
            backoff: a.spec_backoff,
            method: if a.spec_draft.is_some() {
                SpeculativeMethod::Draft
            } else {
                SpeculativeOptions::default().method
            },
        }))?;
        // With a draft model its drafts are measured as they come (one row, "draft").
        let fractions: Vec<Option<f64>> = if a.spec_draft.is_some() {
            vec![None]
        } else {
            a.spec_corrupt.iter().copied().map(Some).collect()
        };
        for (&b, (plain_tps, plain)) in a.batches.iter().zip(&plain) {
            for &c in &fractions {
                let replays: Vec<Arc<DraftReplay>> = plain
                    .iter()
                    .map(|t| {
                        Arc::new(DraftReplay {
                            tokens: t.clone(),
                            corrupt: c.unwrap_or(0.0),
                        })
                    })
                    .collect();
                let before = engine.stats();
                let replay = |i: usize| c.map(|_| replays[i].clone());
                let (tps, got) = round(&engine, a, b, &replay)?;
                let after = engine.stats();
                let drafted = after.spec_draft_tokens - before.spec_draft_tokens;
                let kept = after.spec_accepted_tokens - before.spec_accepted_tokens;
                let verifies = after.spec_verify_steps - before.spec_verify_steps;
                let paused = after.spec_paused_steps - before.spec_paused_steps;
                let equal = got.iter().zip(plain).filter(|(x, y)| x == y).count();
                let c = c.map_or("draft".to_string(), |c| format!("{c:.2}"));
                println!(
                    "| {k} | {b} | {c} | {tps:.0} | {plain_tps:.0} | {:.2} | {:.0}% ({kept}/{drafted}) | {:.2} | {paused} | {equal}/{b} |",
                    tps / plain_tps,
                    100.0 * kept as f64 / drafted.max(1) as f64,
                    (kept + verifies) as f64 / verifies.max(1) as f64,
                );
            }
        }
    }
    plain_again("again after the sweep")?;
    Ok(())
}
