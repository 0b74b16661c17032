//! The geometry of one varlen batch, shared by the model, the runner, the scheduler and the
//! worker command: [`SeqInput`] (one sequence's new tokens, context and block table),
//! [`LogitRows`], the wire form [`SeqCommand`], and the slot/row arithmetic over them.
//!
//! Invariants (what [`check_seq`] enforces, on the head and on every worker alike): every
//! sequence has `q_len >= 1` new tokens, `context_len >= q_len`, a block table covering
//! `context_len` tokens, and its new tokens sit at positions `context_len - q_len ..
//! context_len`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Above this batch, graph buckets grow by steps of [`LARGE_BUCKET_STEP`] instead of doubling
/// (a batch of 300 padded to 512 would do 70% more matmul work once the step is
/// compute-bound; `runner::buckets`).
pub const DOUBLING_UP_TO: usize = 256;
/// The step between large graph buckets.
pub const LARGE_BUCKET_STEP: usize = 128;

/// The row class of a step of `t` token rows: the bound of the graph buckets' range that
/// holds it (8 up to 8 rows, the next power of two up to [`DOUBLING_UP_TO`], then the next
/// multiple of [`LARGE_BUCKET_STEP`] above it). Every bucket is such a bound, so a step and
/// the bucket that replays it (padded) share a class; the kernels pick a cuBLAS algorithm by
/// class, so both give every row the same bits.
pub fn row_class(t: usize) -> usize {
    if t <= 8 {
        8
    } else if t <= DOUBLING_UP_TO {
        t.next_power_of_two()
    } else {
        DOUBLING_UP_TO + (t - DOUBLING_UP_TO).div_ceil(LARGE_BUCKET_STEP) * LARGE_BUCKET_STEP
    }
}

/// The largest row bound at most `n` that no graph bucket straddles: rows 1-8 are buckets of
/// their own, and above 8 the powers of two to [`DOUBLING_UP_TO`] and then its multiples of
/// [`LARGE_BUCKET_STEP`] are buckets whenever a step reaches them. A choice an eager step
/// makes by its rows (`rows <= bound`) and the one its graph bucket made at capture then
/// agree; the kernels round their row bounds by it (`KernelOptions::fused_max_rows`,
/// `fused_mma_rows`: 12 acts as 8, since steps of 9-16 rows replay on buckets up to 16).
pub fn bucket_bound(n: usize) -> usize {
    if n <= 8 {
        n
    } else if n <= DOUBLING_UP_TO {
        1 << n.ilog2()
    } else {
        DOUBLING_UP_TO + (n - DOUBLING_UP_TO) / LARGE_BUCKET_STEP * LARGE_BUCKET_STEP
    }
}

/// Partitions of decode attention in a bucket's graph: a fixed grid, each partition growing
/// past its least length (`CudaKernels::decode_partition`) when the context needs it.
/// Partitions past a context exit at once, but in a large batch they are many: large buckets
/// take few (their batch alone fills the GPU); at its least partition length a bucket covers
/// 512-2,048 tokens (with the defaults: 2,048 at 1 row, 1,024 at 2, 512 at 3-16, 1,024 past
/// them) and longer contexts grow the partitions. `small`: the counts of the 1-row, 3-4-row and
/// 5-16-row buckets where they are set. Its row ranges hold whole buckets
/// (`runner::buckets::graph_buckets`), so a step of `b` rows and the bucket replaying it get the
/// same count (eager steps take it with `KernelOptions::eager_graph_splits`).
pub fn graph_splits(b: usize, small: SmallSplits) -> usize {
    match (b, small.one, small.few, small.mid) {
        (1, Some(s), ..) | (3 | 4, _, Some(s), _) | (5..=16, .., Some(s)) => s.max(1),
        (0..=4, ..) => 32,
        (5..=16, ..) => 16,
        (17..=64, ..) => 8,
        _ => 4,
    }
}

/// The decode-attention partition counts of the small graph buckets where they differ from
/// [`graph_splits`]' defaults: 1 row (`KernelOptions::graph_splits_one`) and 3-4 rows
/// (`KernelOptions::graph_splits_few`); 5-16 rows (`KernelOptions::graph_splits_mid`).
/// None: [`graph_splits`]' defaults (32 up to 4 rows, 16 for 5-16).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmallSplits {
    /// The 1-row bucket's count.
    pub one: Option<usize>,
    /// The 3- and 4-row buckets' count.
    pub few: Option<usize>,
    /// The 5- to 16-row buckets' count.
    pub mid: Option<usize>,
}

/// One sequence of a varlen batch.
#[derive(Debug, Clone)]
pub struct SeqInput<'a> {
    /// New tokens of this sequence in the batch (1 for a decode step).
    pub q_len: usize,
    /// Tokens in the context after this step (cached + new).
    pub context_len: usize,
    /// The sequence's KV blocks, in order.
    pub block_table: &'a [u32],
    /// Which rows of logits to return: none, the last token's, or every new token's.
    pub logits: LogitRows,
    /// The LoRA slot its tokens run through (`None`: the base weights alone).
    pub adapter: Option<u32>,
}

/// Which logits rows a sequence wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// No logits (a prefill chunk that does not end the prompt).
    None,
    /// The last new token's row (the next-token distribution).
    Last,
    /// Every new token's row (scoring).
    All,
}

/// One sequence of a forward command (the wire form of [`SeqInput`], which workers run
/// without logits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqCommand {
    /// New tokens of the sequence in this step.
    pub q_len: usize,
    /// Context length after the step.
    pub context_len: usize,
    /// The sequence's KV blocks.
    pub block_table: Vec<u32>,
}

impl SeqCommand {
    /// The wire form of `s`.
    pub fn from_input(s: &SeqInput<'_>) -> Self {
        Self {
            q_len: s.q_len,
            context_len: s.context_len,
            block_table: s.block_table.to_vec(),
        }
    }

    /// The batch form of this command (a worker asks for no logits).
    pub fn as_input(&self) -> SeqInput<'_> {
        SeqInput {
            q_len: self.q_len,
            context_len: self.context_len,
            block_table: &self.block_table,
            logits: LogitRows::None,
            adapter: None,
        }
    }
}

/// Checks one sequence's geometry for blocks of `block_size` tokens (see the module
/// invariants); the error says what is wrong.
pub fn check_seq(
    q_len: usize,
    context_len: usize,
    block_table: &[u32],
    block_size: usize,
) -> std::result::Result<(), String> {
    if q_len == 0 || context_len < q_len || block_table.len() * block_size < context_len {
        return Err(format!(
            "bad sequence in batch: q_len {q_len} context {context_len} blocks {}",
            block_table.len()
        ));
    }
    Ok(())
}

/// Checks that every block of `block_table` lies in a pool of `num_blocks` (block tables
/// that come from elsewhere: a worker checks the head's; the head's own come from its pool).
pub fn check_blocks(block_table: &[u32], num_blocks: usize) -> std::result::Result<(), String> {
    match block_table.iter().find(|&&b| b as usize >= num_blocks) {
        Some(b) => Err(format!(
            "block {b} is outside this rank's {num_blocks} blocks"
        )),
        None => Ok(()),
    }
}

/// Checks a batch (see [`check_seq`]; contexts within `max_positions`) and returns each new
/// token's position and cache slot, in batch order.
pub fn positions_and_slots(
    tokens: &[u32],
    seqs: &[SeqInput<'_>],
    block_size: usize,
    max_positions: usize,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let total: usize = seqs.iter().map(|s| s.q_len).sum();
    if total != tokens.len() || total == 0 {
        return Err(Error::Engine(format!(
            "batch has {} tokens but its sequences hold {total}",
            tokens.len()
        )));
    }
    let mut positions = Vec::with_capacity(total);
    let mut slots = Vec::with_capacity(total);
    let bs = block_size;
    for s in seqs {
        check_seq(s.q_len, s.context_len, s.block_table, bs).map_err(Error::Engine)?;
        if s.context_len > max_positions {
            return Err(Error::TooLarge(format!(
                "context of {} tokens exceeds the {max_positions} positions this engine serves",
                s.context_len
            )));
        }
        for p in s.context_len - s.q_len..s.context_len {
            positions.push(p as u32);
            slots.push(s.block_table[p / bs] * bs as u32 + (p % bs) as u32);
        }
    }
    Ok((positions, slots))
}

/// The rows of the batch whose logits are asked for, in order.
pub fn logit_rows(seqs: &[SeqInput<'_>]) -> Vec<u32> {
    let mut rows: Vec<u32> = Vec::new();
    let mut start = 0u32;
    for s in seqs {
        let n = s.q_len as u32;
        match s.logits {
            LogitRows::None => {}
            LogitRows::Last => rows.push(start + n - 1),
            LogitRows::All => rows.extend(start..start + n),
        }
        start += n;
    }
    rows
}
