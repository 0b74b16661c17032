//! The scheduler's side of KV memory, all through [`KvManager`](crate::cache::KvManager):
//! admission (prefix-cache reuse, swap-in), block growth (eviction before preemption),
//! preemption by swap or recompute, release into the prefix cache, and cancellation of
//! requests whose caller went away.
//!
//! Invariant: every block a sequence holds is one pool reference, released exactly once
//! (`release_seq`, `preempt` or `fail`); the prefix cache holds its own references.

use std::time::Instant;

use super::core::Scheduler;
use super::seq::{Loading, Seq};

impl Scheduler {
    /// Stops the work of callers that went away (dropped their `Pending`): their blocks are
    /// released (and their computed prefix cached) at once.
    pub(super) fn drop_abandoned(&mut self) {
        let before = self.waiting.len();
        let mut gone: Vec<Seq> = Vec::new();
        let mut kept = std::collections::VecDeque::with_capacity(before);
        for s in self.waiting.drain(..) {
            if s.reply.is_abandoned() {
                gone.push(s);
            } else {
                kept.push_back(s);
            }
        }
        self.waiting = kept;
        for s in &gone {
            if s.swapped.is_some() {
                self.kv.unreserve_swap(self.kv.blocks_for(s.computed));
            }
        }
        let mut cancelled = gone.len();
        // A step in flight indexes `running` (pipeline.rs): it is settled before any running
        // sequence goes, and with it in flight nothing goes (a caller that leaves between
        // this check and the loop below is dropped on the next pass, not under the step).
        let running_gone = self.running.iter().any(|s| s.reply.is_abandoned());
        if running_gone {
            self.settle();
        }
        let mut i = 0;
        while running_gone && i < self.running.len() {
            if self.running[i].reply.is_abandoned() {
                let mut s = self.running.remove(i);
                self.release_seq(&mut s);
                cancelled += 1;
            } else {
                i += 1;
            }
        }
        if cancelled > 0 {
            tracing::debug!(cancelled, "dropped requests whose callers went away");
            self.cancelled += cancelled as u64;
            self.publish_stats();
        }
    }

    /// The KV blocks free or held by the prefix cache now: what a new admission could use
    /// (it grows when a sequence finishes or is preempted).
    fn kv_room(&self) -> usize {
        let st = self.kv.stats();
        st.blocks_free + st.cache.map_or(0, |c| c.cached_blocks)
    }

    /// Whether a waiting request could be admitted now: one waits, a slot is free, and the
    /// last admission did not fail on KV memory that has not grown since. (A request whose
    /// prefix another one is still computing counts as admissible: it is retried each pass.)
    /// Most sequences decoding at once (resolved at load: the options' or derived).
    fn max_running(&self) -> usize {
        self.info.max_running
    }

    pub(super) fn admission_possible(&self) -> bool {
        !self.waiting.is_empty()
            && self.running.len() + self.loading.len() < self.max_running()
            && self.kv_blocked_at.is_none_or(|room| self.kv_room() > room)
    }

    /// Admits waiting requests (FIFO) while there is room for their whole current context:
    /// swapped-out sequences get their KV back; others reuse their longest cached prefix.
    /// Records when it stops for lack of KV memory (`kv_blocked_at`).
    pub(super) fn admit(&mut self) {
        self.kv_blocked_at = None;
        // What the SMs still have to prefill: the tiers weigh a load against it.
        let queued: usize = self
            .running
            .iter()
            .map(|s| s.tokens.len() - s.computed.min(s.tokens.len()))
            .sum();
        if let Some(t) = self.kv.tiers_mut() {
            t.set_prefill_queue(queued);
        }
        // Requests whose adapter waits for a device slot are passed over (they wait; nobody
        // else does).
        let mut skip = 0;
        while self.running.len() + self.loading.len() < self.max_running() {
            let Some(seq) = self.waiting.get(skip) else {
                break;
            };
            if !self.may_admit(seq) {
                break;
            }
            let adapter = seq.request.adapter.clone();
            let slot = match self.adapter_slot(adapter.as_ref()) {
                Ok(slot) => slot,
                Err(None) => {
                    skip += 1;
                    continue;
                }
                Err(Some(e)) => {
                    let s = self.waiting.remove(skip).expect("exists");
                    tracing::warn!(error = %e, "cannot move a LoRA adapter into a device slot; the request fails");
                    self.stats.lock().requests_failed += 1;
                    s.reply.send(Err(e));
                    continue;
                }
            };
            let seq = &self.waiting[skip];
            if seq.swapped.is_some() {
                let n = self.kv.blocks_for(seq.tokens.len() + 1);
                let Some(blocks) = self.kv.allocate(n) else {
                    self.kv_blocked_at = Some(self.kv_room());
                    break;
                };
                let mut seq = self.waiting.remove(skip).expect("exists");
                seq.slot = slot;
                let data = seq.swapped.take().expect("swapped");
                let kv_blocks = self.kv.blocks_for(seq.computed);
                self.kv.unreserve_swap(kv_blocks);
                if let Err(e) = self.runner.swap_in(&blocks[..kv_blocks], &data) {
                    tracing::warn!(error = %e, "swap-in failed; recomputing the sequence");
                    seq.computed = 0;
                }
                seq.blocks = blocks;
                self.stats.lock().swap_ins += 1;
                self.running.push(seq);
                continue;
            }
            // The last token is always computed (its logits are needed), so it is not looked up.
            let lookup = &seq.tokens[..seq.tokens.len() - 1];
            let total = seq.tokens.len() + 1;
            let prefix_cache = self.kv.prefix_cache();
            let running = &self.running;
            let bs = self.opts.block_size;
            let mut deferred = false;
            let defer = |cached| {
                deferred = prefix_cache && prefix_in_flight(running, (seq.ns, lookup), cached, bs);
                deferred
            };
            let admitted = self.kv.admit_with(seq.ns, lookup, total, defer, true);
            let Some(a) = admitted else {
                if !deferred {
                    self.kv_blocked_at = Some(self.kv_room());
                }
                break;
            };
            let mut seq = self.waiting.remove(skip).expect("exists");
            seq.slot = slot;
            seq.blocks = a.blocks;
            seq.computed = a.cached_tokens;
            seq.pin = a.pin;
            let first = seq.admitted.is_none();
            if first {
                seq.count_prompt_cache(a.cached_tokens, a.host_tokens, a.disk_tokens);
            }
            seq.admitted.get_or_insert_with(Instant::now);
            match (a.reading, a.loading) {
                // Its prefix is on its way to the device (read from disk first): it waits,
                // nobody else does; once done (checked, its blocks published) it runs
                // (`poll_loading`).
                (Some(r), _) => self.loading.push((seq, Loading::Read(r, first))),
                (None, Some(t)) => self.loading.push((seq, Loading::Copy(t))),
                (None, None) => self.running.push(seq),
            }
        }
    }

    /// Gives back what a leaving sequence holds: its whole computed blocks go into the prefix
    /// cache (so a later turn or a recompute hits them), its pin and block references are dropped.
    pub(super) fn release_seq(&mut self, seq: &mut Seq) {
        let computed = seq.computed.min(seq.tokens.len());
        self.kv
            .release_in(seq.ns, &seq.tokens[..computed], &seq.blocks, seq.pin.take());
        seq.blocks.clear();
        seq.slot = None;
    }

    /// Makes sure `running[i]` has blocks for `tokens` tokens, preempting others if needed.
    /// Returns false if `running[i]` itself had to be preempted.
    pub(super) fn grow(&mut self, mut i: usize, tokens: usize) -> bool {
        loop {
            let need = self
                .kv
                .blocks_for(tokens)
                .saturating_sub(self.running[i].blocks.len());
            if need == 0 {
                return true;
            }
            if let Some(new) = self.kv.allocate(need) {
                self.running[i].blocks.extend(new);
                return true;
            }
            // Victim: the newest request (FCFS: the latest submitted gives way first, so a
            // preempted request, requeued with its old submission time, is not picked again
            // before newer ones); may be `i` itself.
            let victim = (0..self.running.len())
                .max_by_key(|&j| self.running[j].submitted)
                .expect("running is not empty");
            self.preempt(victim);
            match victim.cmp(&i) {
                std::cmp::Ordering::Equal => return false,
                // The victim sat before `i`: `i` moved down by one.
                std::cmp::Ordering::Less => i -= 1,
                std::cmp::Ordering::Greater => {}
            }
        }
    }

    /// Preempts `running[j]`: swaps its KV out to host memory when the swap budget allows,
    /// else requeues it for recompute (its computed prefix stays in the prefix cache, evictable).
    pub(super) fn preempt(&mut self, j: usize) {
        let mut seq = self.running.remove(j);
        seq.preemptions += 1;
        let kv_blocks = self.kv.blocks_for(seq.computed);
        let swapped = if seq.computed > 0 && self.kv.reserve_swap(kv_blocks) {
            match self.runner.swap_out(&seq.blocks[..kv_blocks]) {
                Ok(data) => Some(data),
                Err(e) => {
                    self.kv.unreserve_swap(kv_blocks);
                    tracing::warn!(error = %e, "swap-out failed; preempting by recompute");
                    None
                }
            }
        } else {
            None
        };
        if let Some(data) = swapped {
            self.kv.release_uncached(&seq.blocks, seq.pin.take());
            seq.blocks.clear();
            seq.swapped = Some(data);
            self.stats.lock().swap_outs += 1;
            tracing::debug!(
                generated = seq.generated(),
                "preempting a sequence (swap to host)"
            );
        } else {
            self.release_seq(&mut seq);
            seq.computed = 0;
            tracing::debug!(
                generated = seq.generated(),
                "preempting a sequence (requeue and recompute)"
            );
        }
        self.stats.lock().preemptions += 1;
        self.waiting.push_front(seq);
    }
}

/// Whether `tokens` (of prefix-cache namespace `ns`) shares more than `cached` tokens (by
/// whole blocks) with the prompt of a running sequence of the same namespace still in prefill: admitting it now would compute that prefix twice; a step
/// later it is in the prefix cache.
fn prefix_in_flight(
    running: &[Seq],
    (ns, tokens): (u64, &[u32]),
    cached: usize,
    bs: usize,
) -> bool {
    running
        .iter()
        .filter(|s| s.ns == ns && s.computed < s.prompt_len())
        .any(|s| {
            let common = s
                .request
                .prompt
                .iter()
                .zip(tokens)
                .take_while(|(a, b)| a == b)
                .count();
            common / bs * bs > cached
        })
}
