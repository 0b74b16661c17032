//! Speculative decoding with n-gram drafts (prompt lookup): each eligible decode sequence
//! gets drafts from an index of its own tokens, the step runs its last token and the drafts
//! together (logits of every position), and the model's own choice at each position (its
//! argmax, or its draw for a sampled request) says how many drafts to keep.
//!
//! Sampled requests: an n-gram draft is a one-hot proposal `q = δ(d)`. Rejection sampling
//! keeps it with probability `min(1, p(d) / q(d)) = p(d)` and otherwise draws from the
//! residual `max(p - q, 0)`, normalized: `p` without `d`. Drawing `x ~ p` and keeping the
//! draft when `x == d` (else `x` is the next token) is that same rule: `P(x = d) = p(d)`, and
//! `x` given `x != d` is distributed as `p` without `d`. Each verifying row draws `x` with the
//! uniform number of its output position (`Rng::nth`), so a seeded request gives the tokens
//! it gives without drafts.
//!
//! Invariants: a sequence keeps exactly the tokens decoding without drafts would have
//! produced (a draft is kept only when it equals the model's choice at its position, and the
//! first choice that differs is the next token); only kept tokens enter the sequence (so only
//! they are streamed or published to the prefix cache; the KV written for dropped drafts lies
//! past `computed` and is overwritten); the index costs O(new tokens) per step, never the
//! transcript's length.

use super::core::Scheduler;
use super::ngram::NgramIndex;
use super::seq::{Planned, Seq};
use crate::engine::options::{DraftReplay, SpeculativeMethod};
use crate::engine::runner::sampler::Rng;

/// Whether a sequence may decode with drafts: no repetition penalty (it would need the
/// drafts among the tokens so far of each verifying row) and no grammar (its masks follow
/// one token at a time). Greedy and sampled requests both may; log-probs are taken from the
/// verifying step's rows, one a kept token.
pub(super) fn eligible(s: &Seq) -> bool {
    unpenalized(s) && s.grammar.is_none()
}

/// Whether a sequence decodes without a repetition penalty (drafts would need to be among
/// each verifying row's tokens so far for one).
fn unpenalized(s: &Seq) -> bool {
    s.request.repetition_penalty.is_none_or(|p| p == 1.0)
}

/// Whether a constrained sequence's forced tokens may go into its steps as drafts
/// (`EngineOptions::grammar_fast_forward`): no repetition penalty (the row after the drafts
/// would need them among its tokens so far).
fn forced_eligible(s: &Seq, fast_forward: bool) -> bool {
    fast_forward && s.grammar.is_some() && unpenalized(s)
}

impl Scheduler {
    /// Whether drafts are made this step (speculation on, and few enough sequences run).
    pub(super) fn speculating(&self) -> bool {
        self.opts
            .speculative
            .is_some_and(|o| self.running.len() <= o.max_batch)
    }

    /// Whether constrained sequences' forced tokens go into steps as drafts now
    /// (`EngineOptions::grammar_fast_forward`, few enough sequences running).
    fn fast_forwarding(&self) -> bool {
        self.opts.grammar_fast_forward
            && self.running.len() <= self.opts.grammar_fast_forward_max_batch
    }

    /// Whether the next plan may give a sequence drafts: speculating, and some running
    /// sequence eligible and not backing off. Only then are decode steps kept from pipelined
    /// decode (drafts need the previous step's token); steps of ineligible (constrained,
    /// penalized) or backing-off sequences pipeline.
    pub(super) fn may_draft(&self) -> bool {
        let ff = self.fast_forwarding();
        self.speculating()
            && self
                .running
                .iter()
                .any(|s| (eligible(s) && s.spec_skip == 0) || forced_eligible(s, ff))
    }

    /// A step launched pipelined (without drafts) counts as one of the plain steps of each
    /// backing-off sequence in `plan`, as a planned step does in [`Scheduler::draft`].
    pub(super) fn skip_pipelined(&mut self, plan: &[Planned]) {
        if self.opts.speculative.is_some_and(|o| o.backoff) {
            for p in plan {
                let s = &mut self.running[p.index];
                s.spec_skip = s.spec_skip.saturating_sub(1);
            }
        }
    }

    /// Counts a decode step that runs without drafts because speculation is paused by the
    /// batch size (`EngineStats::spec_paused_steps`).
    pub(super) fn count_paused_speculation(&self) {
        if self.opts.speculative.is_some() && !self.speculating() {
            self.stats.lock().spec_paused_steps += 1;
        }
    }

    /// What the device checks a step's draws against (`ModelRunner::accept_drafts`): per
    /// logits row the draft its draw must equal (`u32::MAX` after a sequence's last draft and
    /// for rows without drafts), and where each sequence with logits rows (`counts`) starts.
    pub(super) fn draft_rows(&self, plan: &[Planned], counts: &[usize]) -> (Vec<u32>, Vec<u32>) {
        let (mut drafts, mut starts) = (Vec::new(), vec![0u32]);
        for (p, &c) in plan.iter().zip(counts).filter(|(_, c)| **c > 0) {
            let draft = &self.running[p.index].draft;
            for j in 0..c {
                let d = if c > 1 { draft.get(j).copied() } else { None };
                drafts.push(d.unwrap_or(u32::MAX));
            }
            starts.push(drafts.len() as u32);
        }
        (drafts, starts)
    }

    /// With a draft model: the drafts of every decode sequence that may draft this step, made
    /// in one batch (K forwards of all of them instead of K a sequence) and left for
    /// [`Scheduler::draft`] to take (cut to the step's token budget there).
    pub(super) fn draft_ahead(&mut self) {
        let Some(o) = self.opts.speculative.filter(|_| self.speculating()) else {
            return;
        };
        let Some(dm) = self.draft_model.as_ref() else {
            return;
        };
        if o.method != SpeculativeMethod::Draft {
            return;
        }
        let max_context = self.max_context;
        let (mut items, mut who) = (Vec::new(), Vec::new());
        for (i, s) in self.running.iter_mut().enumerate() {
            s.drafted_ahead = None;
            let skip = o.backoff && s.spec_skip > 0;
            let decode = s.tokens.len() == s.computed + 1;
            let k = room(s, max_context, o.num_tokens);
            if !decode || skip || k == 0 || !eligible(s) || s.request.draft_replay.is_some() {
                continue;
            }
            let Seq {
                tokens, draft_kv, ..
            } = s;
            items.push((
                &tokens[..],
                draft_kv.get_or_insert_with(Default::default),
                k,
            ));
            who.push(i);
        }
        if items.is_empty() {
            return;
        }
        let made = dm.propose_batch(&mut items);
        drop(items);
        self.stats.lock().spec_draft_forwards = dm.forwards();
        match made {
            Ok(drafts) => {
                for (i, d) in who.into_iter().zip(drafts) {
                    self.running[i].drafted_ahead = Some(d);
                }
            }
            Err(e) => {
                // No drafts this step; those sequences decode as usual.
                tracing::warn!(error = %e, "the draft model failed; decoding without drafts");
                for i in who {
                    self.running[i].draft_kv = None;
                    self.running[i].drafted_ahead = Some(Vec::new());
                }
            }
        }
    }

    /// Sets `running[i]`'s drafts for a decode step with at most `budget` tokens in all
    /// (its last token included) and returns how many it got (0: a plain decode step).
    pub(super) fn draft(&mut self, i: usize, budget: usize) -> usize {
        let Some(o) = self.opts.speculative.filter(|_| self.speculating()) else {
            self.running[i].draft.clear();
            return 0;
        };
        let ff = self.fast_forwarding();
        let max_context = self.max_context;
        let draft_model = self.draft_model.as_ref();
        let eos = &self.eos;
        let s = &mut self.running[i];
        s.draft.clear();
        s.draft_masks.clear();
        s.verified_logprobs.clear();
        if forced_eligible(s, ff) {
            // The drafts are the tokens the grammar forces, each kept by its masked draw.
            let room = room(s, max_context, o.num_tokens).min(budget.saturating_sub(1));
            let Some(g) = s.grammar.as_mut().filter(|_| room > 0) else {
                return 0;
            };
            // A grammar that fails here fails the step's mask of this sequence as usual.
            if let Ok((tokens, masks)) = g.forced(room, |t| eos.contains(&t)) {
                s.draft = tokens;
                s.draft_masks = masks;
            }
            return s.draft.len();
        }
        if !eligible(s) {
            return 0;
        }
        if o.backoff && s.spec_skip > 0 {
            s.spec_skip -= 1;
            return 0;
        }
        let room = room(s, max_context, o.num_tokens).min(budget.saturating_sub(1));
        if room == 0 {
            return 0;
        }
        if let Some(replay) = &s.request.draft_replay {
            s.draft = replayed_drafts(replay, s.generated(), room);
            return s.draft.len();
        }
        match o.method {
            SpeculativeMethod::Ngram { min, max } => {
                let index = s.ngram.get_or_insert_with(|| NgramIndex::new(min, max));
                s.draft = index.propose(&s.tokens, room);
            }
            SpeculativeMethod::Draft if s.drafted_ahead.is_some() => {
                s.draft = s.drafted_ahead.take().unwrap_or_default();
                s.draft.truncate(room);
            }
            SpeculativeMethod::Draft => {
                let Some(dm) = draft_model else { return 0 };
                let kv = s.draft_kv.get_or_insert_with(Default::default);
                let made = dm.propose(&s.tokens, kv, room);
                self.stats.lock().spec_draft_forwards = dm.forwards();
                match made {
                    Ok(d) => s.draft = d,
                    Err(e) => {
                        // No drafts this step; the sequence decodes as usual.
                        tracing::warn!(error = %e, "the draft model failed; decoding without drafts");
                        s.draft_kv = None;
                    }
                }
            }
        }
        s.draft.len()
    }
}

/// The drafts `s` may take (its next token's room within the cap and the context), at most `k`.
fn room(s: &Seq, max_context: usize, k: usize) -> usize {
    (s.max_new.saturating_sub(s.generated() + 1))
        .min(max_context.saturating_sub(s.tokens.len() + 1))
        .min(k)
}

/// Benchmarks only (`DraftReplay`): up to `n` drafts for output positions `at..` of the
/// replayed continuation, position `i`'s token replaced by another when a hash of `i` (the
/// first number of an `Rng` seeded with it) falls below the corrupted fraction.
fn replayed_drafts(r: &DraftReplay, at: usize, n: usize) -> Vec<u32> {
    r.tokens
        .iter()
        .enumerate()
        .skip(at)
        .take(n)
        .map(|(i, &t)| {
            if f64::from(Rng::new(i as u64).nth(0)) < r.corrupt {
                t ^ 1
            } else {
                t
            }
        })
        .collect()
}

/// After a verify step of `s` that kept `kept` drafts: the backoff's count of failed
/// verifies in a row, and the plain steps it takes before drafting again (1, 3, 7, 15).
pub(super) fn after_verify(s: &mut Seq, kept: usize) {
    if kept > 0 {
        s.spec_misses = 0;
    } else {
        s.spec_misses = (s.spec_misses + 1).min(4);
        s.spec_skip = (1 << s.spec_misses) - 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sequence's new tokens after a verify: the kept drafts and the target after them
    /// (`targets[i]`: the model's token after the last token and `i` drafts), by the engine's
    /// rule (`runner::accept::kept_drafts`).
    fn verified(draft: &[u32], targets: &[u32]) -> Vec<u32> {
        let mut drafts = draft.to_vec();
        drafts.push(u32::MAX);
        let n = targets.len() as u32;
        let kept = crate::engine::runner::accept::kept_drafts(targets, &drafts, &[0, n])[0];
        targets[..=kept as usize].to_vec()
    }

    #[test]
    fn the_longest_earlier_suffix_proposes_what_followed_it() {
        let mut ix = NgramIndex::new(2, 4);
        // ... 7 8 9 10 11 ... 7 8 9  -> 10 11 (the 3-gram 7 8 9 occurred before)
        let t = [1, 7, 8, 9, 10, 11, 12, 5, 7, 8, 9];
        assert_eq!(ix.propose(&t, 2), vec![10, 11]);
        assert_eq!(ix.propose(&t, 9), vec![10, 11, 12, 5, 7, 8, 9]);
        // The latest earlier occurrence wins: 3 4 occurs twice, the second is followed by 6.
        let mut ix = NgramIndex::new(2, 2);
        assert_eq!(ix.propose(&[3, 4, 5, 3, 4, 6, 3, 4], 1), vec![6]);
        // Nothing repeats: no draft; a suffix never finds itself.
        let mut ix = NgramIndex::new(2, 4);
        assert!(ix.propose(&[1, 2, 3, 4], 3).is_empty());
        // Growing the sequence indexes only the new positions, and finds matches in them.
        let mut ix = NgramIndex::new(2, 3);
        let mut t: Vec<u32> = (100..200).collect();
        assert!(ix.propose(&t, 4).is_empty());
        t.extend([150, 151]);
        assert_eq!(ix.propose(&t, 4), vec![152, 153, 154, 155]);
    }

    /// A 32k-token transcript growing token by token: each position is indexed once per
    /// length (the work of a step does not grow with the transcript), and a repeat far back
    /// is still found.
    #[test]
    fn a_32k_transcript_costs_each_step_only_its_new_token() {
        let mut ix = NgramIndex::new(2, 4);
        let mut t: Vec<u32> = (0..32_000u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % 150_000)
            .collect();
        ix.propose(&t, 4);
        let after_prompt = ix.inserted;
        // Ends 0..31_998 (before the last token); an n-gram needs n - 1 tokens before its end.
        assert_eq!(after_prompt, (31_999 - 1) + (31_999 - 2) + (31_999 - 3));
        for step in 0..200 {
            t.push(t[100 + step]);
            let before = ix.inserted;
            let d = ix.propose(&t, 4);
            assert_eq!(
                ix.inserted - before,
                3,
                "step {step}: one new position, three lengths"
            );
            if step >= 3 {
                assert_eq!(d, t[101 + step..105 + step].to_vec(), "step {step}");
            }
        }
    }

    /// The rejection sampler of sampled rows (`verified` over each verifying row's draw with
    /// its position's uniform number) on a toy model of 5 tokens whose next-token
    /// distribution depends on the last token: 40,000 seeded 3-token outputs drafted by a
    /// fixed guesser are chi-square tested against the model's own distribution (125
    /// outcomes), and each equals the output decoded without drafts from the same seed.
    /// Mutations that fail it: keeping one draft past the first mismatch, drawing a row with
    /// the step's first uniform number instead of its position's.
    #[test]
    fn rejection_sampling_of_drafts_keeps_the_models_distribution() {
        use crate::engine::request::SamplingParams;
        use crate::engine::runner::sampler::{Rng, kept, sample_with};
        const V: usize = 5;
        let logits = |prev: u32| -> Vec<f32> {
            (0..V)
                .map(|t| (((t as u32 * 7 + prev * 3) % 11) as f32) * 0.35)
                .collect()
        };
        let params = SamplingParams {
            temperature: 0.8,
            seed: 0,
            ..SamplingParams::greedy()
        };
        let probs = |prev: u32| -> Vec<f64> {
            let cand = logits(prev).into_iter().enumerate();
            let (ids, p) = kept(cand.map(|(i, v)| (i as u32, v)).collect(), &params, 0.8);
            let mut out = vec![0.0; V];
            for (i, q) in ids.iter().zip(p) {
                out[i.0 as usize] = q as f64;
            }
            out
        };
        let decode = |seed: u64, drafts: bool| -> (Vec<u32>, usize, usize) {
            let rng = Rng::new(seed);
            let (mut toks, mut drafted, mut accepted) = (Vec::new(), 0, 0);
            while toks.len() < 3 {
                let last = *toks.last().unwrap_or(&0u32);
                let room = 3 - toks.len() - 1;
                let draft: Vec<u32> = if drafts {
                    [(last + 1) % V as u32, (last + 3) % V as u32][..room.min(2)].to_vec()
                } else {
                    Vec::new()
                };
                let targets: Vec<u32> = (0..=draft.len())
                    .map(|j| {
                        let ctx = if j == 0 { last } else { draft[j - 1] };
                        sample_with(&logits(ctx), &params, rng.nth((toks.len() + j) as u64))
                    })
                    .collect();
                let new = verified(&draft, &targets);
                drafted += draft.len();
                accepted += new.len() - 1;
                toks.extend(new);
            }
            (toks, drafted, accepted)
        };
        let n = 40_000u64;
        let mut counts = vec![0u64; V * V * V];
        let (mut drafted, mut accepted) = (0, 0);
        for seed in 0..n {
            let (t, d, a) = decode(seed, true);
            assert_eq!(t, decode(seed, false).0, "seed {seed}");
            counts[(t[0] as usize * V + t[1] as usize) * V + t[2] as usize] += 1;
            drafted += d;
            accepted += a;
        }
        assert!(
            accepted > 0 && accepted < drafted,
            "{accepted} of {drafted}"
        );
        let mut chi2 = 0.0;
        let p0 = probs(0);
        for (cell, &c) in counts.iter().enumerate() {
            let (a, b, c3) = (cell / (V * V), (cell / V) % V, cell % V);
            let e = n as f64 * p0[a] * probs(a as u32)[b] * probs(b as u32)[c3];
            if e > 0.0 {
                chi2 += (c as f64 - e).powi(2) / e;
            } else {
                assert_eq!(c, 0, "an outcome of probability 0 was drawn");
            }
        }
        // 124 degrees of freedom: the 0.1% critical value is ~170.
        assert!(chi2 < 170.0, "chi-square {chi2:.1}");
    }
}
