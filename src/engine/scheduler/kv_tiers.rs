//! The scheduler's side of the KV tiers below the GPU (`cache::Tiers`): setting them up from
//! the options at start-up (measuring the rates that decide between loading and recomputing,
//! logging the three budgets in one line), re-keying them after a weight update, and the
//! episodes' pins.

use std::time::Instant;

use super::core::Scheduler;
use super::seq::{Loading, Seq};
use crate::cache::{BlockIo, LoadPolicy, TierConfig, Tiers};
use crate::engine::batch::{LogitRows, SeqInput};
use crate::engine::options::KvLoad;

const GIB: f64 = (1u64 << 30) as f64;

impl Scheduler {
    /// Sets the tiers up as the options say (`block_bytes`: one block's KV; `world`: ranks).
    /// They need the prefix cache, one rank and an architecture whose state is all in the KV;
    /// otherwise they stay off (with a log line saying why).
    pub(super) fn start_tiers(&mut self, block_bytes: usize, world: usize) {
        let host_bytes = (self.opts.kv_host_gib.max(0.0) * GIB) as usize;
        let disk = self.opts.kv_disk.clone();
        if host_bytes == 0 && disk.is_none() {
            return;
        }
        let why_not = if !self.kv.prefix_cache() {
            Some("the prefix cache is off")
        } else if world > 1 {
            Some("tensor parallelism (the ranks' shards would have to move in step)")
        } else if !self.cfg.kv_only_swap_out_is_safe() {
            Some(self.cfg.kv_only_reason())
        } else {
            None
        };
        if let Some(why) = why_not {
            if disk.is_some() {
                tracing::warn!(reason = why, "the disk KV tier is off");
            }
            tracing::info!(
                reason = why,
                "the host KV tier is off (swap on preemption only)"
            );
            return;
        }
        // Pinned memory for the host tier, and (with a disk tier) for the blocks queued for it.
        let queue = if disk.is_some() {
            crate::cache::DISK_QUEUE_BLOCKS * block_bytes
        } else {
            0
        };
        let io = self
            .runner
            .kv_io(host_bytes + queue, self.opts.kernels.kv_load_direct);
        let load = match self.opts.kv_load {
            KvLoad::Always => LoadPolicy::Always,
            KvLoad::Never => LoadPolicy::Never,
            KvLoad::Measured => self.measure_rates(
                io.as_ref(),
                block_bytes,
                disk.as_ref().map(|d| d.dir.as_path()),
            ),
        };
        let layout = format!(
            "{} layers {} kv_heads {} head_dim {}",
            self.runner.kv_format_tag(),
            self.cfg.num_hidden_layers,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim()
        );
        let tiers = Tiers::new(
            TierConfig {
                host_bytes,
                disk: disk
                    .as_ref()
                    .map(|d| (d.dir.clone(), (d.gib.max(0.0) * GIB) as usize)),
                load,
                model: self.weights.digest.clone(),
                layout,
                block_size: self.opts.block_size,
                block_bytes,
            },
            io,
        );
        let disk_on = tiers.stats().disk_on;
        tracing::info!(
            gpu_blocks = self.info.num_blocks,
            gpu_gib = format!("{:.2}", (self.info.num_blocks * block_bytes) as f64 / GIB),
            host_gib = self.opts.kv_host_gib,
            disk_gib = disk.as_ref().filter(|_| disk_on).map_or(0.0, |d| d.gib),
            disk_dir = %disk.as_ref().map_or(String::from("off"), |d| d.dir.display().to_string()),
            "KV tiers: GPU, host, disk"
        );
        self.kv.set_tiers(tiers);
    }

    /// Times block copies both ways, a read from the disk tier's directory and a prefill, and
    /// returns the policy they give (logged).
    fn measure_rates(
        &mut self,
        io: &dyn BlockIo,
        block_bytes: usize,
        disk_dir: Option<&std::path::Path>,
    ) -> LoadPolicy {
        let bs = self.opts.block_size;
        let cuda = self.info.device != "cpu";
        let want_tokens = if cuda { 1024 } else { 128 };
        let n_blocks = (want_tokens / bs).clamp(1, (self.kv.capacity() / 2).max(1));
        let Some(blocks) = self.kv.allocate(n_blocks) else {
            return LoadPolicy::Always;
        };
        let copies = (|| -> crate::error::Result<(f64, f64)> {
            let few = &blocks[..blocks.len().min(32)];
            let data = io.read(few)?; // warm
            let t = Instant::now();
            let data2 = io.read(few)?;
            self.runner.synchronize()?;
            let d2h = t.elapsed().as_secs_f64();
            let t = Instant::now();
            if let Some(t) = io.write(few, &data)? {
                t.0.wait();
            }
            self.runner.synchronize()?;
            let h2d = t.elapsed().as_secs_f64();
            let bytes = data2.iter().map(|d| d.bytes().len()).sum::<usize>() as f64;
            Ok((bytes / d2h.max(1e-9), bytes / h2d.max(1e-9)))
        })();
        let prefill = (|| -> crate::error::Result<f64> {
            let n = n_blocks * bs;
            let tokens: Vec<u32> = (0..n as u32).map(|i| i % 1000 + 10).collect();
            let input = SeqInput {
                q_len: n,
                context_len: n,
                block_table: &blocks,
                logits: LogitRows::Last,
                adapter: None,
            };
            let mut secs = f64::MAX;
            for _ in 0..2 {
                let t = Instant::now();
                self.runner.forward(&tokens, std::slice::from_ref(&input))?;
                self.runner.synchronize()?;
                secs = secs.min(t.elapsed().as_secs_f64());
            }
            Ok(n as f64 / secs.max(1e-9))
        })();
        self.kv.release_uncached(&blocks, None);
        let disk_read = disk_dir.and_then(|dir| disk_read_rate(dir, block_bytes * 4));
        let (Ok((d2h, h2d)), Ok(prefill)) = (copies, prefill) else {
            tracing::warn!("measuring the KV tiers' rates failed; loads are always chosen");
            return LoadPolicy::Always;
        };
        // A disk block is read, verified, then copied to the device.
        let disk = disk_read.map_or(h2d, |r| 1.0 / (1.0 / r + 1.0 / h2d));
        tracing::info!(
            d2h_gb_s = format!("{:.2}", d2h / 1e9),
            h2d_gb_s = format!("{:.2}", h2d / 1e9),
            disk_to_device_gb_s = format!("{:.2}", disk / 1e9),
            prefill_tok_s = prefill.round(),
            load_tok_s = (h2d / block_bytes as f64 * bs as f64).round(),
            "KV tier rates measured: a prefix below the GPU is loaded when that beats prefill"
        );
        LoadPolicy::Measured {
            host_bytes_per_s: h2d,
            disk_bytes_per_s: disk,
            prefill_tokens_per_s: prefill,
        }
    }

    /// Moves the sequences whose loaded blocks have reached the cache from `loading` to
    /// `running` (the others keep waiting; nobody waits for them); a sequence whose disk
    /// reads are done gets its blocks copied and waits for that copy. A sequence whose caller
    /// went away is released once its copy is done (its blocks are written until then).
    pub(super) fn poll_loading(&mut self) {
        let mut i = 0;
        while i < self.loading.len() {
            if !self.loading[i].1.done() {
                i += 1;
                continue;
            }
            let (mut seq, state) = self.loading.swap_remove(i);
            let ticket = match state {
                Loading::Copy(t) => t,
                Loading::Read(r, first) => match self.read_done(&mut seq, r, first) {
                    Some(t) => {
                        // Copying now: polled again (the last one moved to index i).
                        self.loading.push((seq, Loading::Copy(t)));
                        continue;
                    }
                    None => {
                        self.start_running(seq);
                        continue;
                    }
                },
            };
            if !ticket.0.ok() {
                tracing::warn!(
                    "loading KV blocks back to the device failed; recomputing the sequence"
                );
                seq.computed = 0;
                seq.cached_prompt_tokens = 0;
                seq.tier_prompt_tokens = (0, 0);
            }
            self.start_running(seq);
            // `swap_remove` moved the last one here: look at index i again.
        }
    }

    /// A loaded sequence runs (its blocks published: other requests may find them), unless
    /// its caller went away.
    fn start_running(&mut self, mut seq: Seq) {
        if seq.reply.is_abandoned() {
            self.release_seq(&mut seq);
            self.cancelled += 1;
        } else {
            self.kv
                .publish_in(seq.ns, &seq.tokens[..seq.computed], &seq.blocks);
            self.running.push(seq);
        }
    }

    /// A sequence's disk reads are done: its blocks go to the device (the copy's ticket, if
    /// still running). When fewer came than admission counted (a file gone or corrupt), the
    /// sequence computes from the first missing block, and its prompt's counts say so.
    fn read_done(
        &mut self,
        seq: &mut Seq,
        r: crate::cache::PendingRead,
        first: bool,
    ) -> Option<crate::cache::LoadTicket> {
        let planned = r.planned();
        let done = self.kv.finish_read(r);
        let missing = planned - done.blocks.min(planned);
        if missing > 0 {
            let bs = self.opts.block_size;
            seq.computed -= (missing * bs).min(seq.computed);
            if first {
                seq.count_prompt_cache(seq.computed, done.from_host * bs, done.from_disk * bs);
            }
        }
        done.loading
    }

    /// Waits for every load in progress (disk reads, then copies) and moves its sequence to
    /// `running` (before a weight update, a prefix-cache reset or shutdown).
    pub(super) fn wait_loading(&mut self) {
        while !self.loading.is_empty() {
            for (_, l) in &self.loading {
                l.wait();
            }
            self.poll_loading();
        }
    }

    /// After a weight update: blocks below the GPU of the old weights are never found again.
    pub(super) fn reseed_tiers(&mut self) {
        let digest = self.weights.digest.clone();
        if let Some(t) = self.kv.tiers_mut() {
            t.reseed(&digest);
        }
    }
}

/// Bytes per second reading a file of `bytes` written into `dir` (read back and removed);
/// `None` when the directory cannot be written (the tier will say so when it opens).
fn disk_read_rate(dir: &std::path::Path, bytes: usize) -> Option<f64> {
    std::fs::create_dir_all(dir).ok()?;
    let path = dir.join(".rate-probe.tmp");
    std::fs::write(&path, vec![7u8; bytes]).ok()?;
    let t = Instant::now();
    let back = std::fs::read(&path)
        .ok()
        .map(|b| crate::cache::checksum(&b));
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    back.map(|_| bytes as f64 / secs.max(1e-9))
}
