//! KV memory of the scheduler: admission (prefix-cache lookup, swap-in), block growth with
//! eviction before preemption, preemption by swap or recompute, release into the prefix cache,
//! and cancellation of requests whose caller went away.
//!
//! Invariant: every block a sequence holds is one pool reference, released exactly once
//! (`release_seq`, `preempt` or `fail`); the prefix cache holds its own references.

use std::time::Instant;

use super::{Scheduler, Seq};

impl Scheduler {
    /// Stops the work of callers that went away (dropped their `Pending`): their blocks are
    /// released (and their computed prefix cached) at once.
    pub(super) fn drop_abandoned(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.reply.is_abandoned());
        let mut cancelled = before - self.waiting.len();
        let mut i = 0;
        while i < self.running.len() {
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

    /// Takes `n` free blocks, evicting unpinned cached prefixes if needed.
    pub(super) fn take_blocks(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.pool.num_free()
            && let Some(r) = &mut self.radix
        {
            let short = n - self.pool.num_free();
            if let Err(e) = r.evict(short, &mut self.pool) {
                tracing::error!(error = %e, "block accounting error while evicting");
            }
        }
        self.pool.allocate(n)
    }

    /// Admits waiting requests (FIFO) while there is room for their whole current context:
    /// swapped-out sequences get their KV back; others reuse their longest cached prefix.
    pub(super) fn admit(&mut self) {
        while self.running.len() < self.opts.max_running {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            if seq.swapped.is_some() {
                let n = self.blocks_for(seq.tokens.len() + 1);
                let Some(blocks) = self.take_blocks(n) else {
                    break;
                };
                let mut seq = self.waiting.pop_front().expect("front exists");
                let data = seq.swapped.take().expect("swapped");
                let kv_blocks = self.blocks_for(seq.computed);
                self.swap_used -= kv_blocks * self.block_bytes;
                if let Err(e) = self.cache.write_blocks(&blocks[..kv_blocks], &data) {
                    tracing::warn!(error = %e, "swap-in failed; recomputing the sequence");
                    seq.computed = 0;
                }
                seq.blocks = blocks;
                self.stats.lock().swap_ins += 1;
                self.running.push(seq);
                continue;
            }
            let tokens = seq.tokens.clone();
            let first_admission = seq.admitted.is_none();
            let hit = self
                .radix
                .as_mut()
                .map(|r| r.lookup(&tokens[..tokens.len() - 1]));
            let (cached_blocks, cached_tokens) = hit
                .as_ref()
                .map(|m| (m.blocks.clone(), m.tokens))
                .unwrap_or_default();
            let need = self.blocks_for(tokens.len() + 1) - cached_blocks.len();
            let defer = self.radix.is_some()
                && self.prefix_in_flight(&tokens[..tokens.len() - 1], cached_tokens);
            let fresh = if defer { None } else { self.take_blocks(need) };
            let Some(fresh) = fresh else {
                if let (Some(r), Some(m)) = (&mut self.radix, hit) {
                    r.forget_lookup(&m, tokens.len() - 1);
                }
                break;
            };
            let mut seq = self.waiting.pop_front().expect("front exists");
            if let Err(e) = self.pool.retain(&cached_blocks) {
                tracing::error!(error = %e, "block accounting error while reusing a prefix");
            }
            seq.blocks = cached_blocks;
            seq.blocks.extend(fresh);
            seq.computed = cached_tokens;
            seq.pin = hit.map(|m| m.node);
            if first_admission {
                seq.cached_prompt_tokens = cached_tokens.min(seq.prompt_len());
            }
            seq.admitted.get_or_insert_with(Instant::now);
            self.running.push(seq);
        }
    }

    /// Gives back what a leaving sequence holds: its whole computed blocks go into the prefix
    /// cache (so a later turn or a recompute hits them), its pin and block references are dropped.
    pub(super) fn release_seq(&mut self, seq: &mut Seq) {
        if let Some(r) = &mut self.radix {
            let computed = seq.computed.min(seq.tokens.len());
            if let Err(e) = r.insert(&seq.tokens[..computed], &seq.blocks, &mut self.pool) {
                tracing::error!(error = %e, "block accounting error while caching a prefix");
            }
            if let Some(node) = seq.pin.take() {
                r.release(node);
            }
        }
        if let Err(e) = self.pool.release(&seq.blocks) {
            tracing::error!(error = %e, "block accounting error while releasing a sequence");
        }
        seq.blocks.clear();
    }

    /// Makes sure `running[i]` has blocks for `tokens` tokens, preempting others if needed.
    /// Returns false if `running[i]` itself had to be preempted.
    pub(super) fn grow(&mut self, i: usize, tokens: usize) -> bool {
        loop {
            let need = self
                .blocks_for(tokens)
                .saturating_sub(self.running[i].blocks.len());
            if need == 0 {
                return true;
            }
            if let Some(new) = self.take_blocks(need) {
                self.running[i].blocks.extend(new);
                return true;
            }
            // Victim: fewest generated tokens, latest admitted on ties; may be `i` itself.
            let victim = (0..self.running.len())
                .min_by_key(|&j| {
                    (
                        self.running[j].generated(),
                        std::cmp::Reverse(self.running[j].admitted),
                    )
                })
                .expect("running is not empty");
            self.preempt(victim);
            if victim == i {
                return false;
            }
        }
    }

    /// Preempts `running[j]`: swaps its KV out to host memory when the swap budget allows,
    /// else requeues it for recompute (its computed prefix stays in the prefix cache, evictable).
    pub(super) fn preempt(&mut self, j: usize) {
        let mut seq = self.running.remove(j);
        let kv_blocks = self.blocks_for(seq.computed);
        let bytes = kv_blocks * self.block_bytes;
        let swapped = if self.swap_budget > 0
            && self.swap_used + bytes <= self.swap_budget
            && seq.computed > 0
        {
            match self.cache.read_blocks(&seq.blocks[..kv_blocks]) {
                Ok(data) => {
                    self.swap_used += bytes;
                    Some(data)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "swap-out failed; preempting by recompute");
                    None
                }
            }
        } else {
            None
        };
        if let Some(data) = swapped {
            if let (Some(r), Some(node)) = (&mut self.radix, seq.pin.take()) {
                r.release(node);
            }
            if let Err(e) = self.pool.release(&seq.blocks) {
                tracing::error!(error = %e, "block accounting error while swapping out");
            }
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

    /// Whether `tokens` shares more than `cached` tokens (by whole blocks) with the prompt of
    /// a running sequence still in prefill: admitting it now would compute that prefix twice;
    /// a step later it is in the prefix cache.
    pub(super) fn prefix_in_flight(&self, tokens: &[u32], cached: usize) -> bool {
        let bs = self.opts.block_size;
        self.running
            .iter()
            .filter(|s| s.computed < s.prompt_len())
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
}
