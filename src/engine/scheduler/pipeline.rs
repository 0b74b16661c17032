//! Pipelined decode (`EngineOptions::pipelined_decode`): while the GPU runs step n, step
//! n+1 is already queued behind it, fed with step n's token ids on the device, so the GPU
//! does not wait for the host to read step n's tokens, apply them and plan again.
//!
//! A step is continued this way only when it is pure decode of every running sequence on one
//! rank, no waiting request can be admitted now (every slot taken, or the KV memory that
//! refused the last admission has not grown), and the free KV blocks cover every sequence's next
//! position without preempting. The continuation is planned from what the host knows before
//! step n's tokens arrive: each sequence one token further, its KV block allocated ahead.
//! Greedy rows, small top-k draws and whole-vocabulary draws stay on the device; other draws
//! (top-p over the whole vocabulary, large top-k) read the logits to the
//! host (correct, but the step then waits as before), and so do steps with a row that asks
//! for log-probabilities (they are read with the ids). Each sampled row takes the uniform
//! number of the output position it draws (`Rng::nth`), so a sampled request draws what it
//! draws unpipelined. A step with grammar-constrained rows queues only its forward behind step n;
//! its masks need step n's tokens, so its draw is queued once they are read and applied, the
//! masks computed while that forward runs.
//!
//! Invariants:
//! - While a step is in flight (`Scheduler::inflight`), `running` neither loses nor reorders
//!   sequences: the loop settles the step first (reads and applies its tokens) before anything
//!   that would (admission, dropping abandoned requests, scoring).
//! - A sequence that a step's token ends (EOS, a stop string, its cap) gets nothing from the
//!   continuation: its row there is read and dropped, and the KV it wrote lies past the
//!   sequence's computed tokens, in a block the sequence owns, never published to the prefix
//!   cache. So every sequence's tokens are those the unpipelined scheduler gives it.
//! - A continuation that cannot be read leaves its sequences as they were (nothing of it was
//!   applied); a step n that cannot be read is rerun the usual way, sequence by sequence.

use candle_core::Tensor;

use super::core::Scheduler;
use super::seq::InFlight;
use super::seq::Planned;
use super::seq::Seq;
use crate::engine::batch::{LogitRows, SeqInput};
use crate::engine::runner::GpuEvent;
use crate::engine::runner::logprobs::{LogprobRow, Pending as PendingLogprobs, on_device};
use crate::error::Result;

impl Scheduler {
    /// Whether this plan may run pipelined: pure decode of every running sequence, one rank,
    /// no waiting request that could be admitted now.
    pub(super) fn pipelinable(&self, plan: &[Planned]) -> bool {
        self.pipelined
            && !self.may_draft()
            && self.runner.comm().is_none()
            && !self.admission_possible()
            && plan.len() == self.running.len()
            && plan.iter().all(|p| {
                let s = &self.running[p.index];
                // Log-probabilities of a cut distribution need the logits on the host, and a
                // repetition penalty every token drawn so far; such steps wait for them.
                // Whole-vocabulary log-probs travel with the ids.
                p.q_len == 1
                    && s.computed + 1 == s.tokens.len()
                    && (s.request.logprobs.is_none() || on_device(&s.request.sampling))
                    && s.request.repetition_penalty.is_none_or(|p| p == 1.0)
            })
    }

    /// Launches `plan` (pipelinable) without reading its tokens.
    pub(super) fn launch(&mut self, plan: Vec<Planned>) -> Result<InFlight> {
        let tokens: Vec<u32> = plan
            .iter()
            .map(|p| {
                let s = &self.running[p.index];
                s.tokens[s.computed]
            })
            .collect();
        let inputs = decode_inputs(&self.running, &plan, 0);
        let start = self.gpu_event();
        let logits = self.runner.forward(&tokens, &inputs);
        drop(inputs);
        self.in_flight(plan, start, logits, 0)
    }

    /// A launched step's draw (its constrained rows masked, from their grammars as they are
    /// now), queued with the read-back of its ids: the step in flight. `ahead`: tokens each
    /// sequence has drawn and not applied (1 while the step before is in flight).
    fn in_flight(
        &mut self,
        plan: Vec<Planned>,
        start: Option<GpuEvent>,
        logits: Result<Option<Tensor>>,
        ahead: usize,
    ) -> Result<InFlight> {
        let logits = logits?.ok_or_else(no_logits)?;
        let rows = indices(&plan);
        let logits = self.constrained(logits, &rows)?;
        let ids = self.draw_ids(&logits, &rows, ahead)?;
        let lp_rows: Vec<LogprobRow> = plan
            .iter()
            .enumerate()
            .filter_map(|(row, p)| {
                let r = &self.running[p.index].request;
                r.logprobs.map(|k| LogprobRow {
                    row,
                    params: r.sampling,
                    k,
                })
            })
            .collect();
        let logprobs = if lp_rows.is_empty() {
            None
        } else {
            let pending = self.runner.launch_logprobs(&logits, &ids, &lp_rows)?;
            Some((lp_rows, pending))
        };
        let end = self.gpu_event();
        let host = self.runner.read_ids(&ids)?;
        Ok(InFlight {
            plan,
            ids,
            host,
            gpu: (start, end),
            logprobs,
        })
    }

    /// A profile event on the stream now (only when profiling).
    fn gpu_event(&self) -> Option<GpuEvent> {
        self.profile.as_ref().and_then(|_| self.runner.gpu_event())
    }

    /// Launches the step after `prev`, fed with `prev`'s tokens on the device, when it can
    /// run without anything `prev`'s tokens decide: every sequence below its token cap and
    /// the context, blocks for its next position free without preempting. Allocates those
    /// blocks. Its draw is queued too, unless a row has a grammar (then [`Next::Forward`]:
    /// the masks wait for `prev`'s tokens).
    fn launch_next(&mut self, prev: &InFlight) -> Option<Next> {
        if self.admission_possible() || prev.plan.len() != self.running.len() || self.may_draft() {
            return None;
        }
        // After `prev`, each sequence has computed + 1 tokens and its drawn token pending:
        // the next step writes that token's KV at position computed + 1.
        let mut need = 0;
        for p in &prev.plan {
            let s = &self.running[p.index];
            let context = s.computed + 2;
            if s.generated() + 1 >= s.max_new || context > self.max_context {
                return None;
            }
            need += self.kv.blocks_for(context).saturating_sub(s.blocks.len());
        }
        if need > 0 {
            let mut blocks = self.kv.allocate(need)?.into_iter();
            for p in &prev.plan {
                let s = &mut self.running[p.index];
                let more = self
                    .kv
                    .blocks_for(s.computed + 2)
                    .saturating_sub(s.blocks.len());
                s.blocks.extend(blocks.by_ref().take(more));
            }
        }
        let inputs = decode_inputs(&self.running, &prev.plan, 1);
        let start = self.gpu_event();
        let logits = self.runner.forward_fed(&prev.ids, &inputs);
        drop(inputs);
        let plan = prev.plan.clone();
        self.skip_pipelined(&plan);
        if plan.iter().any(|p| self.running[p.index].grammar.is_some()) {
            return Some(Next::Forward(plan, start, logits));
        }
        self.draw_next(plan, start, logits, 1).map(Next::Drawn)
    }

    /// [`in_flight`](Self::in_flight) for a continuation: `None` (with a warning) when it
    /// fails; nothing of it is applied and the sequences go on unpipelined.
    fn draw_next(
        &mut self,
        plan: Vec<Planned>,
        start: Option<GpuEvent>,
        logits: Result<Option<Tensor>>,
        ahead: usize,
    ) -> Option<InFlight> {
        match self.in_flight(plan, start, logits, ahead) {
            Ok(next) => Some(next),
            Err(e) => {
                tracing::warn!(error = %e, "pipelined decode step failed; running unpipelined");
                None
            }
        }
    }

    /// One step with `prev` in flight: launch the next one behind it where possible, then
    /// read and apply `prev`'s tokens (the host work the GPU no longer waits for).
    pub(super) fn step_inflight(&mut self, prev: InFlight) {
        let next = self.launch_next(&prev);
        self.flush_output();
        if !self.settle_one(prev) {
            // `prev` was rerun sequence by sequence: `running` may have changed under `next`,
            // whose tokens are dropped (its KV lies past every sequence's computed tokens).
            if let Some(Next::Drawn(next)) = next {
                let _ = next.host.wait();
            }
            self.finish_done();
            return;
        }
        // `prev`'s tokens are applied (the grammars have taken them): a constrained
        // continuation's masks now, while its forward runs, then its draw.
        let next = match next {
            Some(Next::Forward(plan, start, logits)) => self.draw_next(plan, start, logits, 0),
            Some(Next::Drawn(next)) => Some(next),
            None => None,
        };
        let Some(next) = next else {
            self.finish_done();
            return;
        };
        self.stats.lock().pipelined_steps += 1;
        self.count_paused_speculation();
        // Sequences that `prev`'s token ended: `running` loses them, so the continuation is
        // read now. (A grammar that refuses a token fails the next mask, so the step that
        // computes it: a continuation is dropped, a plain step rerun sequence by sequence.)
        let ended: Vec<bool> = next
            .plan
            .iter()
            .map(|p| self.finish_reason(&self.running[p.index]).is_some())
            .collect();
        if ended.iter().any(|e| *e) {
            // Read the continuation now; keep the rows of the sequences that go on.
            let mut next = next;
            let next_plan = next.plan.clone();
            let logprobs = next.logprobs.take();
            match self.read(next) {
                Ok(ids) => {
                    if let Err(e) = self.take_logprobs(&next_plan, logprobs, &ids, &ended) {
                        tracing::warn!(error = %e, "log-probs of a pipelined step unreadable; its sequences go on unpipelined");
                        self.finish_done();
                        return;
                    }
                    let (plan, toks): (Vec<Planned>, Vec<Option<u32>>) = next_plan
                        .iter()
                        .zip(ids)
                        .zip(&ended)
                        .filter(|(_, e)| !**e)
                        .map(|((p, t), _)| (*p, Some(t)))
                        .unzip();
                    self.apply(&plan, toks);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pipelined decode step unreadable; its sequences go on unpipelined");
                }
            }
            self.finish_done();
        } else {
            // Ends nothing (checked above): streams the new text, keeps `running` as it is.
            self.finish_done();
            self.inflight = Some(next);
        }
    }

    /// Reads and applies the in-flight step's tokens, if there is one, and finishes the
    /// sequences they end. Run before anything that changes `running`.
    pub(super) fn settle(&mut self) {
        if let Some(prev) = self.inflight.take() {
            self.settle_one(prev);
            self.finish_done();
        }
    }

    /// Reads and applies `prev`'s tokens; when they cannot be read, reruns its plan sequence
    /// by sequence (failing only the sequences that fail) and returns false.
    fn settle_one(&mut self, mut prev: InFlight) -> bool {
        let plan = prev.plan.clone();
        let logprobs = prev.logprobs.take();
        match self.read(prev) {
            Ok(ids) => {
                if let Err(e) = self.take_logprobs(&plan, logprobs, &ids, &[]) {
                    self.rerun_each(&plan, e);
                    return false;
                }
                self.apply(&plan, ids.into_iter().map(Some).collect());
                true
            }
            Err(e) => {
                self.rerun_each(&plan, e);
                false
            }
        }
    }

    /// Gives the sequences of `plan` the log-probs of their rows (`ids`: the step's tokens,
    /// read), skipping rows `dropped` marks (their tokens are not applied either).
    fn take_logprobs(
        &mut self,
        plan: &[Planned],
        logprobs: Option<(Vec<LogprobRow>, PendingLogprobs)>,
        ids: &[u32],
        dropped: &[bool],
    ) -> Result<()> {
        let Some((rows, pending)) = logprobs else {
            return Ok(());
        };
        let lps = pending.finish(ids, &rows)?;
        for (r, lp) in rows.iter().zip(lps) {
            if !dropped.get(r.row).copied().unwrap_or(false) {
                self.running[plan[r.row].index].logprobs.push(lp);
            }
        }
        Ok(())
    }

    /// Waits for a step's tokens (and records its GPU span in the step profile).
    fn read(&mut self, step: InFlight) -> Result<Vec<u32>> {
        let ids = step.host.wait()?;
        if let Some(p) = &mut self.profile {
            p.gpu(step.gpu.0, step.gpu.1);
        }
        Ok(ids)
    }
}

/// A continuation launched behind the step in flight.
enum Next {
    /// Forward and draw queued.
    Drawn(InFlight),
    /// Only the forward queued (a row has a grammar): the draw waits for the step in flight's
    /// tokens.
    Forward(Vec<Planned>, Option<GpuEvent>, Result<Option<Tensor>>),
}

/// The `running` indices of a plan's sequences.
fn indices(plan: &[Planned]) -> Vec<usize> {
    plan.iter().map(|p| p.index).collect()
}

/// One decode row for each of `plan`'s sequences, for the token `ahead` places past its
/// first uncomputed one (0: that token; 1: the token the step in flight draws).
fn decode_inputs<'a>(running: &'a [Seq], plan: &[Planned], ahead: usize) -> Vec<SeqInput<'a>> {
    plan.iter()
        .map(|p| {
            let s = &running[p.index];
            SeqInput {
                q_len: 1,
                context_len: s.computed + 1 + ahead,
                block_table: &s.blocks,
                logits: LogitRows::Last,
                adapter: s.slot,
            }
        })
        .collect()
}

fn no_logits() -> crate::error::Error {
    crate::error::Error::Engine("the model returned no logits for a decode step".into())
}
