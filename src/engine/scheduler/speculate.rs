//! Speculative decoding with n-gram drafts (prompt lookup): each eligible decode sequence
//! gets drafts from an index of its own tokens, the step runs its last token and the drafts
//! together (logits of every position), and the model's greedy choice at each position says
//! how many drafts to keep.
//!
//! Invariants: a sequence keeps exactly the tokens greedy decoding without drafts would have
//! produced (a draft is kept only when it equals the model's argmax at its position, and the
//! first argmax that differs is the next token); only kept tokens enter the sequence (so only
//! they are streamed or published to the prefix cache; the KV written for dropped drafts lies
//! past `computed` and is overwritten); the index costs O(new tokens) per step, never the
//! transcript's length.

use super::core::Scheduler;
use super::ngram::NgramIndex;
use super::seq::Seq;
use crate::engine::options::SpeculativeMethod;

/// Whether a sequence may decode with drafts: greedy, no repetition penalty (log-probs are
/// taken from the verifying step's rows, one a kept token).
pub(super) fn eligible(s: &Seq) -> bool {
    s.request.sampling.is_greedy()
        && s.request.repetition_penalty.is_none_or(|p| p == 1.0)
        && s.grammar.is_none()
}

impl Scheduler {
    /// Whether drafts are made this step (speculation on, and few enough sequences run).
    pub(super) fn speculating(&self) -> bool {
        self.opts
            .speculative
            .is_some_and(|o| self.running.len() <= o.max_batch)
    }

    /// Sets `running[i]`'s drafts for a decode step with at most `budget` tokens in all
    /// (its last token included) and returns how many it got (0: a plain decode step).
    pub(super) fn draft(&mut self, i: usize, budget: usize) -> usize {
        let Some(o) = self.opts.speculative.filter(|_| self.speculating()) else {
            self.running[i].draft.clear();
            return 0;
        };
        let max_context = self.max_context;
        let s = &mut self.running[i];
        s.draft.clear();
        s.verified_logprobs.clear();
        if !eligible(s) {
            return 0;
        }
        // Room: the drafts and the model's own next token within the cap and the context.
        let room = (s.max_new.saturating_sub(s.generated() + 1))
            .min(max_context.saturating_sub(s.tokens.len() + 1))
            .min(budget.saturating_sub(1))
            .min(o.num_tokens);
        if room == 0 {
            return 0;
        }
        let SpeculativeMethod::Ngram { min, max } = o.method;
        let index = s.ngram.get_or_insert_with(|| NgramIndex::new(min, max));
        s.draft = index.propose(&s.tokens, room);
        s.draft.len()
    }
}

/// How many drafts the model's greedy choices confirm: `targets[i]` is the argmax after the
/// last token and `i` drafts; drafts are kept while they equal it. The kept drafts and the
/// target after them are the sequence's new tokens.
pub(super) fn verified(draft: &[u32], targets: &[u32]) -> Vec<u32> {
    let kept = draft
        .iter()
        .zip(targets)
        .take_while(|(d, t)| d == t)
        .count();
    targets[..=kept.min(targets.len() - 1)].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn drafts_are_kept_while_they_equal_the_models_choice() {
        assert_eq!(verified(&[5, 6, 7], &[5, 6, 9, 1]), vec![5, 6, 9]);
        assert_eq!(verified(&[5, 6, 7], &[5, 6, 7, 1]), vec![5, 6, 7, 1]);
        assert_eq!(verified(&[5, 6, 7], &[4, 6, 7, 1]), vec![4]);
        assert_eq!(verified(&[], &[4]), vec![4]);
    }
}
