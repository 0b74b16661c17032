//! Decode rows: tok/s at each batch size, one line per batch.

use crate::{Args, prompt};
use policy_serve::GenerationRequest;

/// Decode tok/s at each batch size of `a.batches` (prompt P, N new tokens, EOS ignored),
/// after a warm-up at the same batch size; prints one line per batch under `label`. `edit`
/// adjusts request i (a grammar, an adapter).
pub(crate) fn decode_rows(
    engine: &policy_serve::Engine,
    a: &Args,
    label: &str,
    edit: &dyn Fn(&mut GenerationRequest, usize),
) -> Result<(), Box<dyn std::error::Error>> {
    let one = |p: Vec<u32>, n: usize, i: usize| {
        let mut r = GenerationRequest::new(p).max_new_tokens(n);
        r.ignore_eos = true;
        edit(&mut r, i);
        r
    };
    for &b in &a.batches {
        let warm: Vec<_> = (0..b)
            .map(|i| engine.submit(one(prompt(a.prompt, 100 + i), a.warmup_new.max(1), i)))
            .collect();
        for p in warm {
            p.wait()?;
        }
        let pending: Vec<_> = (0..b)
            .map(|i| engine.submit(one(prompt(a.prompt, 1000 + i), a.new_tokens, i)))
            .collect();
        let gens: Vec<_> = pending
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
        let tps = (b * (a.new_tokens - 1)) as f64 / decode_s;
        println!(
            "{label} decode batch {b}: {tps:.0} tok/s ({:.3} ms/step; prefill of batch {:.0} ms)",
            decode_s * 1e3 / (a.new_tokens - 1) as f64,
            first.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
