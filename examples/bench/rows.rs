//! Decode rows: tok/s at each batch size, one line per batch.

use crate::{Args, prompt};
use policy_serve::{Generation, GenerationRequest};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One measured decode round.
pub(crate) struct Round {
    /// Decode tok/s (after the slowest first token).
    pub(crate) tps: f64,
    /// Decode seconds (the slowest first token to the last token).
    pub(crate) decode_s: f64,
    /// The slowest time to first token (the batch's prefill).
    pub(crate) first_s: f64,
    /// The round's generations, request order.
    pub(crate) gens: Vec<Generation>,
}

/// `b` requests (prompt P, N new tokens, EOS ignored) after a warm-up round of the same size;
/// `edit` adjusts request i (a grammar, an adapter, replayed drafts).
pub(crate) fn decode_round(
    engine: &policy_serve::Engine,
    a: &Args,
    b: usize,
    edit: &dyn Fn(&mut GenerationRequest, usize),
) -> Res<Round> {
    let one = |p: Vec<u32>, n: usize, i: usize| {
        let mut r = GenerationRequest::new(p).max_new_tokens(n);
        r.ignore_eos = true;
        edit(&mut r, i);
        r
    };
    let warm: Vec<_> = (0..b)
        .map(|i| engine.submit(one(prompt(a.prompt, 100 + i), a.warmup_new.max(1), i)))
        .collect();
    for p in warm {
        p.wait()?;
    }
    let pending: Vec<_> = (0..b)
        .map(|i| engine.submit(one(prompt(a.prompt, 1000 + i), a.new_tokens, i)))
        .collect();
    let gens: Vec<Generation> = pending
        .into_iter()
        .map(|p| p.wait())
        .collect::<Result<_, _>>()?;
    let first = gens
        .iter()
        .map(|g| g.time_to_first_token)
        .max()
        .unwrap_or_default();
    let end = gens.iter().map(|g| g.total_time).max().unwrap_or_default();
    let decode_s = (end - first).as_secs_f64();
    Ok(Round {
        tps: (b * (a.new_tokens - 1)) as f64 / decode_s,
        decode_s,
        first_s: first.as_secs_f64(),
        gens,
    })
}

/// Decode tok/s at each batch size of `a.batches` ([`decode_round`]); prints one line per
/// batch under `label`.
pub(crate) fn decode_rows(
    engine: &policy_serve::Engine,
    a: &Args,
    label: &str,
    edit: &dyn Fn(&mut GenerationRequest, usize),
) -> Res<()> {
    for &b in &a.batches {
        let r = decode_round(engine, a, b, edit)?;
        println!(
            "{label} decode batch {b}: {:.0} tok/s ({:.3} ms/step; prefill of batch {:.0} ms)",
            r.tps,
            r.decode_s * 1e3 / (a.new_tokens - 1) as f64,
            r.first_s * 1e3
        );
    }
    Ok(())
}
