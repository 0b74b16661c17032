//! The draft model of speculative decoding (`SpeculativeMethod::Draft`): a second, smaller
//! Qwen3 with the target's vocabulary and a paged KV cache of its own, holding as many tokens
//! as the target's (its blocks come out of the same KV budget, `load.rs`). For a sequence it
//! catches its KV up on the tokens it has not seen and drafts K tokens greedily, one forward
//! a token; the target verifies them like n-gram drafts (a greedy draft is a one-hot
//! proposal, so sampled requests keep the target's distribution exactly, `speculate.rs`).
//!
//! Invariants: a sequence's [`DraftKv`] holds the draft model's KV of its first `computed`
//! tokens; after a verify it is cut back to the tokens the target kept
//! ([`DraftKv::keep`]), so drafts are always made from the sequence's own tokens. Its blocks
//! go back to the pool when it is dropped (a finished, failed or cancelled sequence).

use std::path::Path;
use std::sync::Arc;

use candle_core::Device;
use parking_lot::Mutex;

use crate::engine::batch::{LogitRows, SeqInput};
use crate::engine::model::Model;
use crate::engine::model::config::ModelConfig;
use crate::engine::model::files::ModelFiles;
use crate::engine::model::kv_cache::PagedKvCache;
use crate::engine::model::loader::load_shard;
use crate::engine::model::shard::Shard;
use crate::engine::options::EngineOptions;
use crate::error::{Error, Result};

/// The draft model and its KV cache.
pub(crate) struct DraftRunner {
    model: Model,
    /// Its decode rounds (one token a sequence) replayed as CUDA graphs, for up to
    /// `SpeculativeOptions::max_batch` sequences (with `EngineOptions::cuda_graphs`).
    #[cfg(feature = "cuda")]
    graphs: Option<super::graphs::DecodeGraphs>,
    /// Forwards run so far (`EngineStats::spec_draft_forwards`).
    forwards: std::sync::atomic::AtomicU64,
    cache: PagedKvCache,
    free: Arc<Mutex<Vec<u32>>>,
    block_size: usize,
    prefill_chunk: usize,
}

/// One sequence's KV in the draft model's cache.
#[derive(Default)]
pub(crate) struct DraftKv {
    blocks: Vec<u32>,
    /// Positions whose KV is written (the sequence's tokens, then drafts fed back).
    computed: usize,
    /// Positions whose KV is of the sequence's own tokens (drafts not yet verified excluded):
    /// a sequence that gains tokens without a verify (its drafts dropped) starts from here.
    valid: usize,
    pool: Option<Arc<Mutex<Vec<u32>>>>,
}

impl DraftKv {
    /// After a verify of `drafted` drafts made after `len` tokens, `accepted` of them kept:
    /// the draft model's KV stays valid for the tokens it saw that the sequence now holds.
    pub(crate) fn keep(&mut self, len: usize, drafted: usize, accepted: usize) {
        // It saw the `len` tokens and the drafts it fed back (all but the last).
        let fed = drafted.saturating_sub(1);
        self.computed = self.computed.min(len + accepted.min(fed));
        self.valid = self.computed;
    }
}

impl Drop for DraftKv {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            pool.lock().append(&mut self.blocks);
        }
    }
}

/// The draft model's files and config, checked against the target's: the same vocabulary
/// (the `vocab_size` of both configs and the same `tokenizer.json`), else an error naming
/// both files.
pub(crate) fn draft_files(
    dir: &Path,
    target: &ModelConfig,
    target_dir: &Path,
) -> Result<(ModelFiles, ModelConfig)> {
    let files = ModelFiles::from_dir("draft", dir)?;
    let cfg = ModelConfig::from_file(&files.config)?;
    let target_tok = target_dir.join("tokenizer.json");
    let same_tokenizer = match (std::fs::read(&files.tokenizer), std::fs::read(&target_tok)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if cfg.vocab_size != target.vocab_size || !same_tokenizer {
        return Err(Error::InvalidInput(format!(
            "the draft model's vocabulary differs from the target's: {} (vocab_size {}) against {} (vocab_size {}); a draft model must share the target's tokenizer",
            files.tokenizer.display(),
            cfg.vocab_size,
            target_tok.display(),
            target.vocab_size
        )));
    }
    if cfg.is_moe() {
        return Err(Error::Unsupported(
            "a mixture-of-experts draft model is not served; draft with a dense Qwen3".into(),
        ));
    }
    Ok((files, cfg))
}

impl DraftRunner {
    /// Loads the draft model's weights (before the KV budget is sized, so that the budget
    /// sees the memory they take).
    pub(crate) fn load_model(
        files: &ModelFiles,
        cfg: &ModelConfig,
        device: &Device,
        opts: &EngineOptions,
    ) -> Result<Model> {
        load_shard(
            "draft",
            cfg,
            &files.weights,
            opts.dtype,
            device,
            Shard::FULL,
            &opts.kernels,
            || {},
        )
    }

    /// The draft model `model` (of `cfg`, from `dir`) with a KV cache of `num_blocks` blocks
    /// for contexts of up to `max_context` tokens.
    pub(crate) fn new(
        model: Model,
        cfg: &ModelConfig,
        dir: &Path,
        device: &Device,
        opts: &EngineOptions,
        (num_blocks, max_context): (usize, usize),
    ) -> Result<Self> {
        let cache = PagedKvCache::new(
            cfg,
            model.local_kv_heads(),
            num_blocks,
            opts.block_size,
            model.dtype(),
            device,
        )?;
        tracing::info!(
            dir = %dir.display(),
            layers = cfg.num_hidden_layers,
            hidden = cfg.hidden_size,
            kv_blocks = num_blocks,
            "speculative draft model loaded"
        );
        #[cfg(feature = "cuda")]
        let graphs = draft_graphs(&model, &cache, opts, max_context);
        #[cfg(not(feature = "cuda"))]
        let _ = max_context;
        Ok(Self {
            #[cfg(feature = "cuda")]
            graphs,
            model,
            forwards: Default::default(),
            cache,
            free: Arc::new(Mutex::new((0..num_blocks as u32).rev().collect())),
            block_size: opts.block_size,
            prefill_chunk: opts.prefill_chunk.max(1),
        })
    }

    /// Up to `k` greedy drafts after `tokens` ([`DraftRunner::propose_batch`] of one).
    pub(crate) fn propose(&self, tokens: &[u32], kv: &mut DraftKv, k: usize) -> Result<Vec<u32>> {
        let mut one = [(tokens, kv, k)];
        Ok(self.propose_batch(&mut one)?.pop().unwrap_or_default())
    }

    /// Greedy drafts for several sequences at once: `items[i]` is (its tokens, its draft KV,
    /// how many drafts). Each sequence's KV is caught up on the tokens it has not seen (all
    /// but its last prefill chunk alone, the last one in the batch's first forward, whose last
    /// logits are its first draft), then one forward of every sequence still drafting gives
    /// each its next draft. A sequence whose blocks the pool cannot give gets none.
    pub(crate) fn propose_batch(
        &self,
        items: &mut [(&[u32], &mut DraftKv, usize)],
    ) -> Result<Vec<Vec<u32>>> {
        let mut drafts = vec![Vec::new(); items.len()];
        let mut live = Vec::with_capacity(items.len());
        for (i, (tokens, kv, k)) in items.iter_mut().enumerate() {
            if *k == 0 || tokens.is_empty() || !self.reserve(kv, tokens.len() + *k - 1) {
                continue;
            }
            kv.computed = kv.computed.min(kv.valid).min(tokens.len() - 1);
            while tokens.len() - kv.computed > self.prefill_chunk {
                let end = kv.computed + self.prefill_chunk;
                self.catch_up(&tokens[kv.computed..end], end, &kv.blocks)?;
                kv.computed = end;
                kv.valid = end;
            }
            live.push(i);
        }
        let mut first = true;
        while !live.is_empty() {
            // The first round feeds each sequence's unseen tokens, the others its last draft.
            let mut flat = Vec::new();
            let mut fed = Vec::with_capacity(live.len());
            for &i in &live {
                let (tokens, kv, _) = &items[i];
                let start = flat.len();
                match drafts[i].last() {
                    Some(&d) if !first => flat.push(d),
                    _ => flat.extend_from_slice(&tokens[kv.computed..]),
                }
                fed.push(flat.len() - start);
            }
            let ids = {
                let inputs: Vec<SeqInput<'_>> = live
                    .iter()
                    .zip(&fed)
                    .map(|(&i, &q)| SeqInput {
                        q_len: q,
                        context_len: items[i].1.computed + q,
                        block_table: &items[i].1.blocks,
                        logits: LogitRows::Last,
                        adapter: None,
                    })
                    .collect();
                self.count_forward();
                #[cfg(feature = "cuda")]
                let replayed = match &self.graphs {
                    Some(g) if !first => g.replay(&self.model, &flat, &inputs)?,
                    _ => None,
                };
                #[cfg(not(feature = "cuda"))]
                let replayed = None;
                let logits = match replayed {
                    Some(l) => l,
                    None => self
                        .model
                        .forward(&flat, &inputs, &self.cache, None)?
                        .ok_or_else(|| {
                            Error::Engine("the draft model returned no logits".into())
                        })?,
                };
                crate::engine::runner::sampler::greedy_ids(&self.model, &logits)?
                    .to_vec1::<u32>()?
            };
            if ids.len() != live.len() {
                return Err(Error::Engine(format!(
                    "the draft model returned {} tokens for {} sequences",
                    ids.len(),
                    live.len()
                )));
            }
            for ((&i, &q), id) in live.iter().zip(&fed).zip(ids) {
                let kv = &mut items[i].1;
                kv.computed += q;
                if first {
                    kv.valid = kv.computed;
                }
                drafts[i].push(id);
            }
            first = false;
            live.retain(|&i| drafts[i].len() < items[i].2);
        }
        Ok(drafts)
    }

    /// The draft model's forwards so far.
    pub(crate) fn forwards(&self) -> u64 {
        self.forwards.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn count_forward(&self) {
        self.forwards
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Blocks for `positions` KV positions of `kv` from the pool (false: not enough free).
    fn reserve(&self, kv: &mut DraftKv, positions: usize) -> bool {
        kv.pool.get_or_insert_with(|| self.free.clone());
        let need = positions.div_ceil(self.block_size);
        let mut free = self.free.lock();
        while kv.blocks.len() < need {
            match free.pop() {
                Some(b) => kv.blocks.push(b),
                None => return false,
            }
        }
        true
    }

    /// One forward of `tokens` (a prefill chunk, no logits) ending the context at
    /// `context_len`: the draft KV caught up on them.
    fn catch_up(&self, tokens: &[u32], context_len: usize, table: &[u32]) -> Result<()> {
        let input = [SeqInput {
            q_len: tokens.len(),
            context_len,
            block_table: table,
            logits: LogitRows::None,
            adapter: None,
        }];
        self.count_forward();
        self.model.forward(tokens, &input, &self.cache, None)?;
        Ok(())
    }
}

/// The draft model's decode graphs: buckets up to `SpeculativeOptions::max_batch` sequences
/// (their buffers are a few MB, outside the KV budget); `None` without graphs or on failure
/// (the rounds then run eagerly).
#[cfg(feature = "cuda")]
fn draft_graphs(
    model: &Model,
    cache: &PagedKvCache,
    opts: &EngineOptions,
    max_context: usize,
) -> Option<super::graphs::DecodeGraphs> {
    let rows = opts.speculative.map_or(1, |o| o.max_batch.max(1));
    if !opts.cuda_graphs {
        return None;
    }
    let bs = opts.block_size;
    let made = super::graphs::DecodeGraphs::allocate(model, (rows, rows), max_context, bs, &[])
        .and_then(|g| {
            g.map(|mut g| {
                g.capture(model, cache, opts.kernels.graph_pdl, None)?;
                Ok(g)
            })
            .transpose()
        });
    match made {
        Ok(g) => {
            if let Some(g) = &g {
                tracing::info!(buckets = ?g.buckets(), "draft model decode graphs captured");
            }
            g
        }
        Err(e) => {
            tracing::warn!(error = %e, "no CUDA graphs for the draft model; it drafts eagerly");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a verify the draft KV keeps the tokens the draft model saw that the sequence now
    /// holds: the `len` tokens and the kept drafts it fed back (all drafts but the last).
    /// Mutations that fail it: keeping every fed draft (the rejected ones' KV would seed the
    /// next drafts), keeping the last draft too (never fed: its KV was not written).
    #[test]
    fn keep_cuts_the_draft_kv_back_to_the_kept_tokens() {
        let kv = |computed| {
            let mut k = DraftKv::default();
            k.computed = computed;
            k
        };
        // 10 tokens, 4 drafts: the draft model saw the 10 and drafts 1-3 (computed 13).
        for (accepted, want) in [(0, 10), (1, 11), (2, 12), (3, 13), (4, 13)] {
            let mut k = kv(13);
            k.keep(10, 4, accepted);
            assert_eq!(k.computed, want, "{accepted} kept");
        }
        // One draft: nothing fed back.
        let mut k = kv(10);
        k.keep(10, 1, 1);
        assert_eq!(k.computed, 10);
        // Never more than it had.
        let mut k = kv(5);
        k.keep(10, 4, 4);
        assert_eq!(k.computed, 5);
    }
}
