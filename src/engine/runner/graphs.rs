//! Decode steps replayed as CUDA graphs: one graph per batch-size bucket (1-8 exact, then
//! 16, ..., 256, then steps of 128, up to `max_running` and `max_graph_batch`), captured at
//! start-up over static device buffers, replayed with one upload of the step's integer inputs.
//!
//! Invariants:
//! - Every buffer a graph touches is allocated here, before the KV cache is sized (so the KV
//!   budget counts it), and lives as long as the graphs; the forward it captures allocates
//!   nothing, copies nothing from the host and never synchronizes (`model/kernel_forward.rs`).
//! - A bucket's padding rows have context length 0 and cache slot `u32::MAX`: they write no
//!   KV and attend to nothing; real rows never read them (every op is row-wise but attention,
//!   which reads only a row's own block table).
//! - The input layout of a bucket of `B` rows is `ids [B] | positions [B] | slots [B] |
//!   context lengths [B] | table width [1] | block tables [B * width]`; the decode kernels
//!   read the width from the device and run a fixed number of partitions, so one graph serves
//!   every context length the engine serves.
//! - On an engine with LoRA slots every bucket has a second graph that adds the adapters'
//!   deltas; its tiles (`CudaKernels::lora_into`; count 0: unused) sit after the largest
//!   bucket's inputs, one per row at most.
//!   A step with a row on an adapter replays that one; others replay the base's.
//! - A step that verifies speculative drafts replays too, one row per position a sequence
//!   verifies (`graph_rows.rs`), on graphs captured without the fused decode attention for
//!   the buckets that have it (`verify_graphs`, up to the largest verify size `allocate` was
//!   given, each of which is a bucket of its own; larger buckets never fuse, so their graph
//!   serves both).
//! - With `KernelOptions::fused_mma` the fused buckets that take its tensor-core kernels have
//!   a second graph on them (`short_graphs`), and with `fused_long_ctx` every fused bucket a
//!   graph captured unfused (`long_graphs`); a plain decode step replays by its longest
//!   context, as the eager forward chooses (`StepInputs::short_ctx`, `long_ctx`).
//! - Only decode and verify steps replay; prefill chunks and larger batches run eagerly. Under
//!   tensor parallelism (`EngineOptions::tp_graphs`) every rank captures the same buckets in
//!   the same order, its all-reduces in place on the static buffers (NCCL calls in the graph),
//!   and replays its own graph on the head's command; ranks above 0 compute no logits.

use std::cell::Cell;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaGraph, CudaStream, result};
use candle_core::{DType, Tensor};

use super::buckets::{bucket_for, graph_buckets};
use super::graph_rows::{FIELDS, Row, StepKind, input_layout, padding, step_kind, step_rows};
use crate::engine::batch::SeqInput;
use crate::engine::cuda::{CudaKernels, GreedyScratch, kernel_err};
use crate::engine::model::Model;
use crate::engine::model::kernel_forward::{Activations, KernelForward, StepInputs};
use crate::engine::model::kv_cache::PagedKvCache;
use crate::engine::parallel::comm::CommBackend;
use crate::error::{Error, Result};

mod capture;

/// Captured decode graphs and the static buffers they run on (the engine holds one per
/// model; [`DecodeGraphs::replay`] is also how `examples/graph_check` compares a graph step
/// with an eager one).
pub struct DecodeGraphs {
    buckets: Vec<usize>,
    graphs: Vec<CudaGraph>,
    /// The same steps with LoRA deltas (engines with adapter slots).
    lora_graphs: Vec<CudaGraph>,
    /// Verify steps (rows of one sequence read each other's KV), for the buckets a verify
    /// of up to `verify_rows` rows uses whose decode graph fuses the attention (`None`:
    /// the decode graph serves).
    verify_graphs: Vec<Option<CudaGraph>>,
    /// Decode steps whose contexts fit one cluster of the fused attention, on its tensor-core
    /// kernels (`KernelOptions::fused_mma`), for the buckets that take them.
    short_graphs: Vec<Option<CudaGraph>>,
    /// Decode steps whose longest context passes `KernelOptions::fused_long_ctx`, the
    /// attention unfused, for the buckets whose decode graph fuses it.
    long_graphs: Vec<Option<CudaGraph>>,
    /// Whether each bucket's decode graph fuses the attention (then a verify step needs its
    /// verify graph).
    fused: Vec<bool>,
    /// The most rows a verify step replays (0: none).
    verify_rows: usize,
    /// Profiling only: the ops the captures leave out ([`DecodeGraphs::set_profile_skip`]).
    profile_skip: u8,
    /// Where the rows' LoRA slots start in `input` (engines with adapter slots).
    lora_at: Option<usize>,
    stream: Arc<CudaStream>,
    /// u32 inputs of the largest bucket at the widest table, and its device address.
    input: Tensor,
    input_ptr: u64,
    acts: Activations,
    /// lm_head output in the activation dtype, then in f32: `[max bucket, vocab]`.
    logits_act: Tensor,
    logits: Tensor,
    /// With `KernelOptions::graph_argmax` (rank 0): each row's greedy token, computed with
    /// the f32 logits (`[max bucket]`), and the kernel's scratch.
    greedy: Option<(Tensor, GreedyScratch)>,
    /// The bucket of the last replay when its argmax also wrote the input ids
    /// (`KernelOptions::graph_feed`): a step fed with that replay's greedy tokens finds them
    /// there already.
    fed: Cell<Option<usize>>,
    max_width: usize,
    /// Decode-attention partitions per bucket.
    splits: Vec<usize>,
    block_size: usize,
    bytes: usize,
    capture_secs: f64,
}

// SAFETY: CUDA graph objects need external serialization, not thread affinity: the graphs
// are moved once, with the scheduler, to its thread and only used there (`DecodeGraphs` is
// not `Sync`, so no two threads reach them at once).
unsafe impl Send for DecodeGraphs {}

impl DecodeGraphs {
    /// Allocates the static buffers for the buckets `max_running` reaches, for contexts up to
    /// `max_context` tokens in blocks of `block_size`, and for verify steps of speculative
    /// decoding of the row counts `verify_sizes` (each a bucket of its own, up to
    /// `max_graph_batch`; empty: verify steps run eagerly). `None` without the kernels.
    pub fn allocate(
        model: &Model,
        (max_running, max_graph_batch): (usize, usize),
        max_context: usize,
        block_size: usize,
        verify_sizes: &[usize],
    ) -> Result<Option<Self>> {
        let Some(k) = model.kernels.as_ref() else {
            return Ok(None);
        };
        let mut buckets = graph_buckets(max_running, max_graph_batch);
        let verify: Vec<usize> = verify_sizes
            .iter()
            .copied()
            .filter(|&b| b > 0 && b <= max_graph_batch)
            .collect();
        buckets.extend(&verify);
        buckets.sort_unstable();
        buckets.dedup();
        let verify_rows = verify.iter().copied().max().unwrap_or(0);
        let bmax = *buckets.last().unwrap_or(&1);
        let max_width = max_context.div_ceil(block_size);
        // Splits per bucket: no more than the widest table needs, counted as eager steps are.
        let splits_of = |b: usize| k.step_splits(b, max_width, block_size, true);
        let partials = buckets.iter().map(|&b| b * splits_of(b)).max().unwrap_or(1);
        let vocab = model.qwen3.lm_head.weight().dim(0)?;
        let lora_at = model
            .qwen3
            .lora
            .as_ref()
            .map(|_| bmax * (FIELDS + max_width) + 1);
        let input = k.alloc(bmax * (FIELDS + max_width) + 1 + 3 * bmax, DType::U32)?;
        let input_ptr = k.ptr(&input)?;
        let acts = Activations::new(k, &model.qwen3, bmax, 1, partials)?;
        let splits = buckets.iter().map(|&b| splits_of(b)).collect();
        // Ranks above 0 compute no logits (the head samples): a column, for the views.
        let cols = if model.qwen3.shard().rank == 0 {
            vocab
        } else {
            1
        };
        let logits_act = k.alloc_out((bmax, cols))?;
        let logits = k.alloc((bmax, cols), DType::F32)?;
        let greedy = match k.graph_argmax() && cols == vocab {
            true => Some((k.alloc(bmax, DType::U32)?, k.greedy_scratch(bmax, vocab)?)),
            false => None,
        };
        let bytes = acts.bytes()
            + input.elem_count() * 4
            + logits_act.elem_count() * k.dtype().size_in_bytes()
            + logits.elem_count() * 4;
        Ok(Some(Self {
            buckets,
            graphs: Vec::new(),
            lora_graphs: Vec::new(),
            verify_graphs: Vec::new(),
            short_graphs: Vec::new(),
            long_graphs: Vec::new(),
            fused: Vec::new(),
            verify_rows,
            profile_skip: 0,
            lora_at,
            stream: k.stream().clone(),
            input,
            input_ptr,
            acts,
            logits_act,
            logits,
            greedy,
            fed: Cell::new(None),
            max_width,
            splits,
            block_size,
            bytes,
            capture_secs: 0.0,
        }))
    }

    /// Device memory the static buffers and the captured graphs hold.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The greedy token of each of the first `n` rows of the last replay's logits, computed
    /// with them (`KernelOptions::graph_argmax`; None when off): a view of a static buffer,
    /// valid until the next replay, like the logits.
    pub fn greedy_ids(&self, n: usize) -> Result<Option<Tensor>> {
        match &self.greedy {
            Some((ids, _)) => Ok(Some(ids.narrow(0, 0, n)?)),
            None => Ok(None),
        }
    }

    /// Profiling only (`graph_check --profile-skip`): the next captures leave out the ops
    /// whose `crate::engine::model::kernel_forward::skip` bits `mask` sets (0: none), so a
    /// replay times the step without them; what such a step computes is meaningless.
    pub fn set_profile_skip(&mut self, mask: u8) {
        self.profile_skip = mask;
    }

    /// Seconds the capture took (warm-up runs included).
    pub fn capture_secs(&self) -> f64 {
        self.capture_secs
    }

    /// The buckets captured.
    pub fn buckets(&self) -> &[usize] {
        &self.buckets
    }

    /// Views of a bucket's inputs in the static input buffer.
    fn inputs(&self, b: usize) -> Result<StepInputs> {
        let at = |i: usize, n: usize| -> Result<Tensor> { Ok(self.input.narrow(0, i, n)?) };
        let ids = at(0, b)?;
        Ok(StepInputs {
            pos: at(b, b)?,
            slots: at(2 * b, b)?,
            ctx_lens: at(3 * b, b)?,
            runs: Some(at(4 * b, b)?),
            width: Some(at(FIELDS * b, 1)?),
            tables: at(FIELDS * b + 1, b * self.max_width)?,
            splits: self.splits[self.buckets.iter().position(|&x| x == b).unwrap_or(0)],
            prefill: (ids.clone(), ids.clone(), ids.clone()),
            prefill_keys: 0,
            lora: None,
            verify: false,
            reduce_in_place: true,
            short_ctx: false,
            long_ctx: false,
            skip: self.profile_skip,
            ids,
        })
    }

    /// Writes a bucket's inputs: `rows` (token, position, slot, context length, run, block
    /// table) padded to `b` rows, tables `width` blocks wide.
    /// `keep_ids`: all but the first `b` words (the token ids, which the graph before wrote).
    fn upload(&self, b: usize, rows: &[Row<'_>], width: usize, keep_ids: bool) -> Result<()> {
        let host = input_layout(b, rows, width);
        let skip = if keep_ids { b } else { 0 };
        let dst = self.input_ptr + skip as u64 * 4;
        // SAFETY: `input` holds the largest bucket at the widest table, which bounds `host`
        // (and `skip` <= its length); the copy is ordered on the stream before the graph that
        // reads it.
        unsafe { result::memcpy_htod_async(dst, &host[skip..], self.stream.cu_stream()) }
            .map_err(|e| kernel_err("graph input upload", e))
    }

    /// Writes the step's LoRA tiles (engines with adapter slots; nothing otherwise).
    fn upload_lora(&self, tiles: &[u32]) -> Result<()> {
        let Some(at) = self.lora_at else {
            return Ok(());
        };
        // SAFETY: the input buffer holds the largest bucket's tiles after `at`, which bounds
        // `tiles` (at most one per row); the copy is ordered on the stream before the graph that reads it.
        unsafe {
            result::memcpy_htod_async(
                self.input_ptr + at as u64 * 4,
                tiles,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| kernel_err("graph LoRA slots upload", e))
    }

    /// Runs a step on a graph when it is pure decode within the buckets and the served width;
    /// returns its f32 logits `[B, vocab]` (a view of a static buffer, valid until the next
    /// step), or `None` when the step must run eagerly.
    pub fn replay(
        &self,
        model: &Model,
        tokens: &[u32],
        seqs: &[SeqInput<'_>],
    ) -> Result<Option<Tensor>> {
        self.replay_ids(model, Ids::Host(tokens), seqs)
    }

    /// [`DecodeGraphs::replay`] with the token ids in a device tensor (u32 `[B]`, e.g. the
    /// previous step's argmax): they are copied into the graph's inputs on the stream, after
    /// the upload of the rest, so the step can be launched before they are known on the host.
    pub fn replay_fed(
        &self,
        model: &Model,
        ids: &Tensor,
        seqs: &[SeqInput<'_>],
    ) -> Result<Option<Tensor>> {
        if ids.dtype() != DType::U32 || ids.elem_count() != seqs.len() {
            return Err(kernel_err(
                "graph replay",
                format!(
                    "{} token ids for {} sequences",
                    ids.elem_count(),
                    seqs.len()
                ),
            ));
        }
        self.replay_ids(model, Ids::Device(ids), seqs)
    }

    fn replay_ids(
        &self,
        model: &Model,
        ids: Ids<'_>,
        seqs: &[SeqInput<'_>],
    ) -> Result<Option<Tensor>> {
        let Some(kind) = step_kind(seqs) else {
            return Ok(None);
        };
        let lora = seqs.iter().any(|s| s.adapter.is_some());
        if lora && self.lora_graphs.len() != self.buckets.len() {
            return Ok(None);
        }
        let verify = kind == StepKind::Verify;
        if verify && (lora || matches!(ids, Ids::Device(_))) {
            return Ok(None);
        }
        let n: usize = seqs.iter().map(|s| s.q_len).sum();
        let Some(bi) = bucket_for(&self.buckets, n) else {
            return Ok(None);
        };
        let verify_graph = self.verify_graphs.get(bi).and_then(Option::as_ref);
        let graph = match (lora, verify) {
            (true, _) => self.lora_graphs.get(bi),
            (false, true) if verify_graph.is_some() => verify_graph,
            (false, true) if self.fused.get(bi) == Some(&false) => self.graphs.get(bi),
            (false, true) => None,
            (false, false) => self.graphs.get(bi),
        };
        let Some(mut graph) = graph else {
            return Ok(None);
        };
        let bs = self.block_size;
        let longest = seqs.iter().map(|s| s.context_len).max().unwrap_or(1);
        let width = longest.div_ceil(bs);
        // Plain decode past `fused_long_ctx`: the unfused graph; of contexts that fit one
        // cluster: the tensor-core kernels' graph, where the bucket has one (the eager forward
        // chooses alike: `StepInputs::long_ctx`, `short_ctx`).
        if !lora
            && !verify
            && let Some(k) = model.kernels.as_ref()
        {
            let fwd = KernelForward {
                model: &model.qwen3,
                kernels: k,
            };
            let other = if k.fused_long_context(self.buckets[bi], longest) {
                Some(&self.long_graphs)
            } else if fwd.short_context(self.buckets[bi], self.splits[bi], longest) {
                Some(&self.short_graphs)
            } else {
                None
            };
            if let Some(Some(g)) = other.and_then(|o| o.get(bi)) {
                graph = g;
            }
        }
        if width > self.max_width {
            return Ok(None);
        }
        let placeholders;
        let tokens = match ids {
            Ids::Host(t) => t,
            Ids::Device(_) => {
                placeholders = vec![0u32; n];
                &placeholders[..]
            }
        };
        let b = self.buckets[bi];
        let mut rows = step_rows(tokens, seqs, bs, model.qwen3.max_positions())?;
        rows.resize(b, padding());
        // Fed with the last replay's greedy tokens, which its argmax also wrote into the ids
        // of this bucket (`graph_feed`): they are in place, nothing to copy.
        let fed_in_place = match (ids, &self.greedy, self.fed.get()) {
            (Ids::Device(d), Some((g, _)), Some(last)) if last == b => {
                let k = model.kernels.as_ref();
                k.is_some_and(|k| matches!((k.ptr(d), k.ptr(g)), (Ok(a), Ok(b)) if a == b))
            }
            _ => false,
        };
        // Until this replay is launched the ids are not known to be any replay's tokens.
        self.fed.set(None);
        self.upload(b, &rows, width, fed_in_place)?;
        if lora {
            let k = model.kernels.as_ref();
            let mut tiles = crate::engine::model::lora_slots::kernel_tiles(seqs, b, k);
            tiles.resize(3 * b, 0);
            self.upload_lora(&tiles)?;
        }
        if let Ids::Device(d) = ids
            && !fed_in_place
        {
            let k = model
                .kernels
                .as_ref()
                .ok_or_else(|| kernel_err("graph replay", "the model runs without kernels"))?;
            let src = k.ptr(d)?;
            // SAFETY: `d` holds n u32 (checked by `replay_fed`) and the input buffer starts
            // with at least n ids; the copy is ordered on the stream after the upload it
            // overwrites and before the graph that reads it.
            unsafe {
                result::memcpy_dtod_async(self.input_ptr, src, n * 4, self.stream.cu_stream())
            }
            .map_err(|e| kernel_err("graph token ids", e))?;
        }
        graph
            .launch()
            .map_err(|e| Error::Engine(format!("CUDA graph launch (batch {b}): {e}")))?;
        // (Profiling captures may leave the head, and with it the argmax, out.)
        let feeds = self.greedy.is_some()
            && self.profile_skip == 0
            && model.kernels.as_ref().is_some_and(|k| k.graph_feed());
        self.fed.set(feeds.then_some(b));
        Ok(Some(self.logits.narrow(0, 0, n)?))
    }
}

/// What a capture runs on: the model, its kernels, the KV cache, the ranks' link.
type OnRank<'a> = (
    &'a Model,
    &'a CudaKernels,
    &'a PagedKvCache,
    Option<&'a dyn CommBackend>,
);

/// Where a replayed step's token ids are.
#[derive(Clone, Copy)]
enum Ids<'a> {
    Host(&'a [u32]),
    Device(&'a Tensor),
}

fn mem_info() -> Result<(usize, usize)> {
    result::mem_get_info().map_err(|e| kernel_err("memory info", e))
}
