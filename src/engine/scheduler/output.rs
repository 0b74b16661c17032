//! Output processing of a step: sampled tokens join their sequences, new text is decoded
//! incrementally, stop conditions (EOS, stop strings, the token cap) end sequences, streams get
//! their text, finished and failed requests get their replies.
//!
//! Invariants: the text of a sequence without stop strings may lag its tokens by a step (its
//! tokens wait in `undecoded` and are decoded while the GPU runs the next step, or at its
//! finish); a sequence with stop strings decodes each token at once; a stop string is searched
//! only in the text the newest token can have completed (the new piece plus the longest stop
//! string's length before it); a streamed chunk never holds text that could still become a
//! stop string, nor half a UTF-8 character; the chunks of a stream add up to the final text.

use std::time::Instant;

use super::core::Scheduler;
use super::seq::Planned;
use super::seq::Seq;
use crate::engine::request::{FinishReason, Generation};
use crate::error::Error;

impl Scheduler {
    /// Applies a step's sampled tokens: advance each sequence, publish finished prompts to the
    /// prefix cache, decode new text.
    pub(super) fn apply(&mut self, plan: &[Planned], next: Vec<Option<u32>>) {
        let now = Instant::now();
        // Sequences whose step had drafts take their verified tokens first.
        let verified: Vec<bool> = plan
            .iter()
            .map(|p| !self.running[p.index].verified.is_empty())
            .collect();
        let mut from_drafts = 0;
        for (p, v) in plan.iter().zip(&verified) {
            if *v {
                from_drafts += self.apply_verified(p.index, now) as u64;
            }
        }
        let mut stats = self.stats.lock();
        stats.steps += 1;
        stats.generated_tokens += from_drafts;
        for ((p, tok), v) in plan.iter().zip(next).zip(verified) {
            if v {
                continue;
            }
            let s = &mut self.running[p.index];
            let in_prompt = s.computed < s.prompt_len();
            if in_prompt {
                stats.prefill_tokens += p.q_len.min(s.prompt_len() - s.computed) as u64;
            }
            s.computed += p.q_len;
            if let Some(t) = tok {
                s.tokens.push(t);
                take_in_grammar(s, t, self.eos.contains(&t));
                s.first_token.get_or_insert(now);
                stats.generated_tokens += 1;
                // EOS ends the text (it is not part of it). Sequences with stop strings decode
                // now (their text decides whether they go on); the others' text is decoded
                // while the GPU runs the next step ([`Scheduler::flush_output`]).
                if s.request.ignore_eos || !self.eos.contains(&t) {
                    if s.request.stop.is_empty() {
                        s.undecoded.push(t);
                    } else {
                        s.detok.push(&self.tokenizer, t);
                    }
                }
            }
            // Publish a finished prompt to the prefix cache at once, so that requests sharing
            // it (other episodes of the task) reuse it while this one is still decoding.
            if in_prompt && s.computed >= s.prompt_len() {
                self.kv
                    .publish_in(s.ns, &s.tokens[..s.prompt_len()], &s.blocks.clone());
            }
        }
    }

    /// Applies the tokens a step with drafts verified for `running[i]`, one at a time as
    /// plain decoding would have: each kept draft's KV becomes part of the sequence, and the
    /// first token that ends it (EOS, a stop string, the cap) ends the list. Returns the
    /// tokens taken.
    fn apply_verified(&mut self, i: usize, now: Instant) -> usize {
        let verified = std::mem::take(&mut self.running[i].verified);
        let mut logprobs = std::mem::take(&mut self.running[i].verified_logprobs).into_iter();
        self.running[i].draft.clear();
        let mut taken = 0;
        for (m, t) in verified.into_iter().enumerate() {
            let s = &mut self.running[i];
            // The last token's KV (m = 0), then each kept draft's.
            s.computed += 1;
            debug_assert!(m == 0 || s.computed == s.tokens.len());
            s.tokens.push(t);
            take_in_grammar(s, t, self.eos.contains(&t));
            s.logprobs.extend(logprobs.next());
            s.first_token.get_or_insert(now);
            taken += 1;
            if s.request.ignore_eos || !self.eos.contains(&t) {
                if s.request.stop.is_empty() {
                    s.undecoded.push(t);
                } else {
                    s.detok.push(&self.tokenizer, t);
                }
            }
            if self.finish_reason(&self.running[i]).is_some() {
                break;
            }
            let s = &mut self.running[i];
            s.stop_checked = s.detok.text().len();
        }
        taken
    }

    /// Decodes the tokens whose text was deferred and streams it (run while the GPU works).
    pub(super) fn flush_output(&mut self) {
        for s in &mut self.running {
            if s.undecoded.is_empty() {
                continue;
            }
            for t in s.undecoded.drain(..) {
                s.detok.push(&self.tokenizer, t);
            }
            stream_delta(s);
        }
    }

    /// Fails the sequences at these `running` indices (their KV may be half-written: it is
    /// released without caching); the others go on.
    pub(super) fn fail(&mut self, mut failed: Vec<(usize, Error)>) {
        failed.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, e) in failed {
            let mut s = self.running.remove(i);
            tracing::warn!(error = %e, "request failed; the others go on");
            self.kv.release_uncached(&s.blocks, s.pin.take());
            s.blocks.clear();
            self.stats.lock().requests_failed += 1;
            self.publish_stats();
            s.reply.send(Err(Error::Engine(e.to_string())));
        }
    }

    /// Whether a sequence's newest token ends it (EOS, a stop string, its cap), and why;
    /// `None` also for a sequence without a new token.
    pub(super) fn finish_reason(&self, s: &Seq) -> Option<FinishReason> {
        let generated = s.generated();
        if !is_fresh(s) {
            return None;
        }
        let last = *s.tokens.last()?;
        let may_stop = generated >= s.request.min_tokens;
        if may_stop && !s.request.ignore_eos && self.eos.contains(&last) {
            Some(FinishReason::Eos)
        } else if may_stop && stop_at(s).is_some() {
            Some(FinishReason::Stop)
        } else if generated >= s.max_new {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// Finishes sequences that hit EOS, a stop string or their cap; streams the others' text.
    pub(super) fn finish_done(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            let fresh = is_fresh(s);
            let reason = self.finish_reason(s);
            if fresh && reason.is_none() {
                let s = &mut self.running[i];
                s.stop_checked = s.detok.text().len();
                stream_delta(s);
            }
            match reason {
                Some(r) => {
                    let s = self.running.remove(i);
                    self.finish(s, r);
                }
                None => i += 1,
            }
        }
    }

    pub(super) fn finish(&mut self, mut s: Seq, reason: FinishReason) {
        self.release_seq(&mut s);
        for t in s.undecoded.drain(..) {
            s.detok.push(&self.tokenizer, t);
        }
        s.detok.finish(&self.tokenizer);
        let mut text = s.detok.text().to_string();
        if reason == FinishReason::Stop
            && let Some(cut) = stop_at(&s)
        {
            text.truncate(cut);
        }
        if let Some((sender, sent)) = s.stream.take()
            && text.len() > sent
            && text.is_char_boundary(sent)
        {
            sender.send(&text[sent..]);
        }
        let now = Instant::now();
        let generated = s.generated();
        let g = Generation {
            tokens: s.tokens[s.prompt_len()..].to_vec(),
            text,
            finish_reason: reason,
            prompt_tokens: s.prompt_len(),
            cached_prompt_tokens: s.cached_prompt_tokens,
            cached_prompt_tokens_host: s.tier_prompt_tokens.0,
            cached_prompt_tokens_disk: s.tier_prompt_tokens.1,
            generated_tokens: generated,
            queue_time: s.admitted.map(|a| a - s.submitted).unwrap_or_default(),
            time_to_first_token: s.first_token.map(|f| f - s.submitted).unwrap_or_default(),
            total_time: now - s.submitted,
            preemptions: s.preemptions,
            logprobs: s.request.logprobs.map(|_| std::mem::take(&mut s.logprobs)),
            weights_version: crate::engine::update::WeightsVersion {
                adapter: s.request.adapter.as_ref().map(|h| h.version.clone()),
                ..self.weights.clone()
            },
        };
        self.stats.lock().requests_finished += 1;
        self.publish_stats();
        s.reply.send(Ok(g));
    }
}

/// Whether a sequence has a generated token whose KV is not computed yet (one it has not
/// been checked for ending on).
fn is_fresh(s: &Seq) -> bool {
    s.computed + 1 == s.tokens.len() && s.generated() > 0
}

/// The longest stop string of a request, in bytes.
fn longest_stop(s: &Seq) -> usize {
    s.request.stop.iter().map(String::len).max().unwrap_or(0)
}

/// Where the earliest stop string starts in the text, searching only the part the newest
/// token can have completed (earlier tokens were checked when they came).
fn stop_at(s: &Seq) -> Option<usize> {
    if s.request.stop.is_empty() {
        return None;
    }
    let text = s.detok.text();
    // No stop string ended in the checked text; one may start up to its length before it.
    let mut from = s
        .stop_checked
        .min(text.len())
        .saturating_sub(longest_stop(s));
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    s.request
        .stop
        .iter()
        .filter(|st| !st.is_empty())
        .filter_map(|st| text[from..].find(st.as_str()).map(|at| from + at))
        .min()
}

/// Sends the text generated since the last chunk, holding back what could still become a
/// stop string.
fn stream_delta(s: &mut Seq) {
    let hold = longest_stop(s).saturating_sub(1);
    let text = s.detok.text();
    let mut safe = text.len().saturating_sub(hold);
    while !text.is_char_boundary(safe) {
        safe -= 1;
    }
    // (A decoder that rewrote earlier text could leave `sent` off a character boundary:
    // then nothing more is streamed until the end, which sends the rest.)
    if let Some((sender, sent)) = &mut s.stream
        && safe > *sent
        && text.is_char_boundary(*sent)
    {
        sender.send(&text[*sent..safe]);
        *sent = safe;
    }
}

/// Hands a generated token to the sequence's grammar, if it has one; the grammar takes it
/// when it computes the next mask, on a mask thread (a refusal fails that step, which is then
/// rerun sequence by sequence, so only this sequence fails). An EOS token ends the sequence,
/// not the grammar's sentence: it is not fed (a complete grammar allows it and stops; with
/// `ignore_eos` the grammar keeps allowing only EOS).
fn take_in_grammar(s: &mut Seq, t: u32, eos: bool) {
    if let Some(g) = &mut s.grammar
        && !eos
    {
        g.defer(t);
    }
}
