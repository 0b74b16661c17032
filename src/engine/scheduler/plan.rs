//! Planning and running one step: which running sequences take part with how many new tokens
//! ([`StepPlan`], plain data), the forward on the runner, and sampling its logits.
//!
//! Invariants: decode sequences come first (they batch into one attention group), then prefill
//! chunks, within `max_batched_tokens`; every planned sequence has blocks for its tokens
//! before the forward runs; a failed batched step is retried sequence by sequence.

use std::time::Instant;

use candle_core::Tensor;

use super::core::Scheduler;
use super::seq::{Planned, StepPlan};
use crate::engine::batch::{LogitRows, SeqInput};
use crate::engine::runner::RowDraw;
use crate::engine::runner::logprobs::LogprobRow;
use crate::error::{Error, Result};

impl Scheduler {
    /// Plans the step over the running sequences, growing their blocks (which may preempt).
    fn plan_step(&mut self) -> StepPlan {
        // Decode first, rows on one LoRA adapter together (the kernels read an adapter's rows
        // once per tile of consecutive tokens); prefill chunks keep their arrival order.
        self.running.sort_by_key(|s| {
            let prefill = s.tokens.len() - s.computed != 1;
            (prefill, if prefill { None } else { s.slot })
        });
        self.draft_ahead();
        let mut budget = self.opts.max_batched_tokens;
        let mut plan = StepPlan::default();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let (todo, computed) = {
                let s = &self.running[i];
                (s.tokens.len() - s.computed, s.computed)
            };
            let chunk = if todo == 1 {
                1
            } else {
                self.opts.prefill_chunk
            };
            let mut q = todo.min(budget).min(chunk);
            if todo == 1 {
                q += self.draft(i, budget);
            } else {
                self.running[i].draft.clear();
            }
            let target = computed + q;
            let before = self.running.len();
            if !self.grow(i, target) {
                // `i` itself was preempted; indices after it shifted down by one.
                continue;
            }
            if self.running.len() < before {
                // Someone else was preempted; restart planning (indices shifted).
                plan.seqs.clear();
                budget = self.opts.max_batched_tokens;
                i = 0;
                continue;
            }
            plan.seqs.push(Planned { index: i, q_len: q });
            budget -= q;
            i += 1;
        }
        let decodes = plan.seqs.iter().any(|p| {
            let s = &self.running[p.index];
            s.tokens.len() - s.computed == 1
        });
        if decodes {
            self.count_paused_speculation();
        }
        plan
    }

    /// Plans, runs and processes one step (with pipelined decode, a decode step is
    /// launched and its tokens read in the next call, behind the step after it:
    /// `pipeline.rs`).
    pub(super) fn step(&mut self) {
        if let Some(prev) = self.inflight.take() {
            self.step_inflight(prev);
            return;
        }
        let plan = self.plan_step();
        if plan.seqs.is_empty() {
            return;
        }
        if self.pipelinable(&plan.seqs) {
            match self.launch(plan.seqs.clone()) {
                Ok(f) => {
                    self.inflight = Some(f);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pipelined decode launch failed; running the step as usual");
                }
            }
        }
        match self.run_plan(&plan.seqs) {
            Ok(next) => self.apply(&plan.seqs, next),
            Err(e) => self.rerun_each(&plan.seqs, e),
        }
        self.finish_done();
    }

    /// After a failed step over `plan`: reruns it sequence by sequence, failing only the
    /// sequences that fail alone (a step of one sequence fails it with `e`).
    pub(super) fn rerun_each(&mut self, plan: &[Planned], e: Error) {
        if plan.len() == 1 {
            self.fail(vec![(plan[0].index, e)]);
            return;
        }
        tracing::warn!(error = %e, "batched step failed; retrying sequence by sequence");
        let mut failed = Vec::new();
        for &p in plan {
            match self.run_plan(&[p]) {
                Ok(next) => self.apply(&[p], next),
                Err(e) => failed.push((p.index, e)),
            }
        }
        self.fail(failed);
    }

    /// Runs the forward for `plan`; returns the sampled next token per planned sequence
    /// (None for prefill chunks that do not end the prompt).
    fn run_plan(&mut self, plan: &[Planned]) -> Result<Vec<Option<u32>>> {
        let mut tokens = Vec::new();
        let mut inputs = Vec::with_capacity(plan.len());
        for p in plan {
            let s = &self.running[p.index];
            let drafted = !s.draft.is_empty() && p.q_len == 1 + s.draft.len();
            let logits = if drafted {
                // The last token and its drafts: every position's logits verify one draft.
                tokens.push(s.tokens[s.computed]);
                tokens.extend_from_slice(&s.draft);
                LogitRows::All
            } else {
                tokens.extend_from_slice(&s.tokens[s.computed..s.computed + p.q_len]);
                if s.computed + p.q_len == s.tokens.len() {
                    LogitRows::Last
                } else {
                    LogitRows::None
                }
            };
            inputs.push(SeqInput {
                q_len: p.q_len,
                context_len: s.computed + p.q_len,
                block_table: &s.blocks,
                logits,
                adapter: s.slot,
            });
        }
        // Logits rows per planned sequence (0, 1, or every position with drafts).
        let counts: Vec<usize> = inputs
            .iter()
            .map(|s| match s.logits {
                LogitRows::None => 0,
                LogitRows::Last => 1,
                LogitRows::All => s.q_len,
            })
            .collect();
        let t_launch = Instant::now();
        let ev_start = self.profile.as_ref().and_then(|_| self.runner.gpu_event());
        let logits = self.runner.forward(&tokens, &inputs)?;
        drop(inputs);
        // While the GPU runs this step: the previous steps' deferred output (detokenizing,
        // streaming) of the sequences that do not wait on it.
        let t_overlap = Instant::now();
        self.flush_output();
        let t_sync = Instant::now();
        let mut out = vec![None; plan.len()];
        let Some(logits) = logits else { return Ok(out) };
        // Which sequence each logits row belongs to.
        let rows: Vec<usize> = plan
            .iter()
            .zip(&counts)
            .flat_map(|(p, &c)| std::iter::repeat_n(p.index, c))
            .collect();
        let logits = self.penalized(logits, &rows)?;
        let logits = self.constrained(logits, &rows)?;
        let ids = self.draw_ids(&logits, &rows, 0)?;
        // The drawn ids, and (a step with drafts) the drafts each sequence keeps, decided on
        // the device: one read.
        let (chosen, kept) = if counts.iter().any(|&c| c > 1) {
            let (drafts, starts) = self.draft_rows(plan, &counts);
            self.runner.accept_drafts(&ids, &drafts, &starts)?
        } else {
            (ids.to_vec1()?, Vec::new())
        };
        let mut kept = kept.into_iter();
        // Rows whose request asks for log-probabilities: computed now, with the ids.
        let lp_rows: Vec<LogprobRow> = rows
            .iter()
            .enumerate()
            .filter_map(|(row, &i)| {
                let r = &self.running[i].request;
                r.logprobs.map(|k| LogprobRow {
                    row,
                    params: r.sampling,
                    k,
                })
            })
            .collect();
        let mut lps = if lp_rows.is_empty() {
            Vec::new()
        } else {
            self.runner.logprobs(&logits, (&ids, &chosen), &lp_rows)?
        }
        .into_iter();
        for lp in &lp_rows {
            let seq = &mut self.running[rows[lp.row]];
            if seq.draft.is_empty() {
                seq.logprobs.extend(lps.next());
            } else {
                // A row of a step with drafts: kept with its token, if the token is.
                seq.verified_logprobs.extend(lps.next());
            }
        }
        if self.profile.is_some() {
            let ev_end = self.runner.gpu_event();
            if let Some(prof) = &mut self.profile {
                prof.launch += t_overlap - t_launch;
                prof.overlap += t_sync - t_overlap;
                prof.sync += t_sync.elapsed();
                prof.gpu(ev_start, ev_end);
            }
        }
        let mut row = 0;
        for (k, p) in plan.iter().enumerate() {
            let c = counts[k];
            let kept = if c > 0 {
                kept.next().unwrap_or(0) as usize
            } else {
                0
            };
            if c > 1 {
                let s = &mut self.running[p.index];
                let kept = kept.min(c - 1);
                s.verified = chosen[row..=row + kept].to_vec();
                super::speculate::after_verify(s, kept);
                if let Some(kv) = s.draft_kv.as_mut() {
                    kv.keep(s.tokens.len(), s.draft.len(), kept);
                }
                let mut st = self.stats.lock();
                st.spec_draft_tokens += s.draft.len() as u64;
                st.spec_accepted_tokens += s.verified.len() as u64 - 1;
                st.spec_verify_steps += 1;
            } else if c == 1 {
                out[k] = Some(chosen[row]);
            }
            row += c;
        }
        Ok(out)
    }

    /// `logits` with each row's repetition penalty applied (rows without one as they are).
    fn penalized(&self, logits: Tensor, rows: &[usize]) -> Result<Tensor> {
        let pen: Vec<(usize, f32, &[u32])> = rows
            .iter()
            .enumerate()
            .filter_map(|(row, &i)| {
                let s = &self.running[i];
                s.request
                    .repetition_penalty
                    .filter(|p| *p != 1.0)
                    .map(|p| (row, p, s.tokens.as_slice()))
            })
            .collect();
        if pen.is_empty() {
            return Ok(logits);
        }
        self.runner.penalize(&logits, &pen)
    }

    /// `logits` masked to the tokens each constrained row's grammar allows (rows without a
    /// grammar as they are). The masks are computed here, on CPU threads in parallel, while
    /// the GPU still runs the step's forward (wide masks split in parts of the vocabulary, so
    /// that the step does not wait for its slowest row, unless their parts would be more
    /// than four rounds of the threads); a grammar that fails fails the step (whose
    /// sequences are then retried one by one, so only its own fails).
    pub(super) fn constrained(&mut self, logits: Tensor, rows: &[usize]) -> Result<Tensor> {
        use rayon::prelude::*;
        if !rows.iter().any(|&i| self.running[i].grammar.is_some()) {
            return Ok(logits);
        }
        // Each sequence's first row and its number of rows (more than one: a step with
        // drafts, whose constrained rows come with their masks).
        let mut row_of: std::collections::HashMap<usize, (usize, usize)> =
            std::collections::HashMap::new();
        for (row, &i) in rows.iter().enumerate() {
            row_of.entry(i).or_insert((row, 0)).1 += 1;
        }
        let mut made: Vec<(usize, Vec<u32>)> = Vec::new();
        let mut states: Vec<(usize, &mut crate::grammar::GrammarMatcher)> = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            let (Some(&(row, count)), Some(g)) = (row_of.get(&i), s.grammar.as_mut()) else {
                continue;
            };
            if count == 1 {
                states.push((row, g));
            } else if s.draft_masks.len() == count {
                // Kept until the next plan: a failed step is rerun with the same drafts.
                made.extend((row..).zip(s.draft_masks.iter().cloned()));
            } else {
                return Err(crate::error::Error::Engine(format!(
                    "a constrained sequence verifies {count} rows with {} masks",
                    s.draft_masks.len()
                )));
            }
        }
        let wide: usize = states
            .iter()
            .map(|(_, g)| g.next_mask_threads())
            .filter(|&n| n > 1)
            .sum();
        let may_split = wide <= 4 * rayon::current_num_threads();
        let masks: Result<Vec<(usize, Vec<u32>)>> = if states.len() > 1 {
            states
                .par_iter_mut()
                .map(|(row, g)| Ok((*row, g.mask_with(may_split)?)))
                .collect()
        } else {
            states
                .iter_mut()
                .map(|(row, g)| Ok((*row, g.mask_with(may_split)?)))
                .collect()
        };
        let mut masks = masks?;
        masks.extend(made);
        self.runner.mask_logits(&logits, &masks)
    }

    /// The next token of each of `rows` (indices into `running`, one per row of `logits`;
    /// a sequence's rows consecutive: a step with drafts has one per position it verifies),
    /// left where the logits are (u32 `[rows]`). Each sampled row takes the uniform number
    /// of the output position it draws from its request's generator (`Rng::nth`): the
    /// sequence's next position plus `ahead` (tokens drawn but not yet applied, pipelined
    /// decode) plus the row's place among its sequence's rows. So a sampled token is the same
    /// draw whatever step produced it: with drafts (each verifying row draws from the
    /// model's distribution at its position, and a draft is kept when the draw equals it:
    /// rejection sampling of a one-hot proposal), pipelined or not, alone or batched.
    pub(super) fn draw_ids(
        &mut self,
        logits: &Tensor,
        rows: &[usize],
        ahead: usize,
    ) -> Result<Tensor> {
        let mut place = 0;
        let draws: Vec<RowDraw> = rows
            .iter()
            .enumerate()
            .map(|(r, &i)| {
                place = if r > 0 && rows[r - 1] == i {
                    place + 1
                } else {
                    0
                };
                let s = &self.running[i];
                let params = s.request.sampling;
                let at = (s.generated() + ahead + place) as u64;
                RowDraw {
                    params,
                    uniform: (!params.is_greedy()).then(|| s.rng.nth(at)),
                }
            })
            .collect();
        self.runner.draw_ids(logits, &draws)
    }

    /// Logits of every position of `tokens` (through `adapter`'s LoRA, when given), computed
    /// in prefill chunks on temporary blocks.
    pub(super) fn score(
        &mut self,
        tokens: &[u32],
        adapter: Option<crate::engine::update::AdapterHandle>,
    ) -> Result<Vec<Vec<f32>>> {
        if tokens.is_empty() {
            return Err(Error::InvalidInput("no tokens to score".into()));
        }
        let mut adapter = adapter;
        self.adapter_of_new(&mut adapter)?;
        let slot = self.adapter_slot(adapter.as_ref()).map_err(|e| {
            e.unwrap_or_else(|| {
                Error::Engine(
                    "every LoRA slot is used by running requests; score again when one finishes"
                        .into(),
                )
            })
        })?;
        self.info.check_vocab(tokens)?;
        if tokens.len() > self.max_context {
            return Err(Error::TooLarge(format!(
                "{} tokens exceed the model's context of {}",
                tokens.len(),
                self.max_context
            )));
        }
        let need = self.kv.blocks_for(tokens.len());
        let blocks = self.kv.allocate(need).ok_or_else(|| {
            Error::TooLarge(format!(
                "{} tokens need {need} KV blocks; {} are free now",
                tokens.len(),
                self.kv.num_free()
            ))
        })?;
        let mut rows = Vec::with_capacity(tokens.len());
        let mut done = 0;
        let res: Result<()> = (|| {
            while done < tokens.len() {
                let q = (tokens.len() - done).min(self.opts.prefill_chunk);
                let input = [SeqInput {
                    q_len: q,
                    context_len: done + q,
                    block_table: &blocks,
                    logits: LogitRows::All,
                    adapter: slot,
                }];
                let l = self
                    .runner
                    .forward(&tokens[done..done + q], &input)?
                    .ok_or_else(|| Error::Engine("the model returned no logits".into()))?;
                rows.extend(self.runner.host_rows(&l)?);
                done += q;
            }
            Ok(())
        })();
        self.kv.release_uncached(&blocks, None);
        res.map(|_| rows)
    }
}
