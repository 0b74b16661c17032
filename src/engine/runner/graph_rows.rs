//! The rows of a step a decode graph replays (`graphs.rs`) and the graphs a bucket has: one per decode sequence, or, for
//! a sequence that verifies speculative drafts (its last token and the drafts, every
//! position's logits), one per position, each a decode row whose context ends at that
//! position. Within a layer every row's KV is written before any row attends (the graphs
//! that serve such steps are captured without the fused decode attention), so row `j` of a
//! sequence sees the KV of rows `0..j`: causal within the draft, as a prefill of those
//! tokens would be.

use crate::engine::batch::{LogitRows, SeqInput, positions_and_slots};
use crate::error::Result;

/// The u32 fields of a row, each a `[bucket]` array of a graph's inputs.
pub(super) const FIELDS: usize = 5;

/// One row of a bucket's inputs.
#[derive(Clone)]
pub(super) struct Row<'a> {
    /// Token, position, cache slot, context length, and where the row sits in its sequence's
    /// rows (`(j << 16) | n`: row `j` of `n`; the shared-K/V verify attention reads it).
    pub(super) fields: [u32; FIELDS],
    pub(super) table: &'a [u32],
}

/// A bucket's inputs as uploaded: `rows` (padded to `b`) field by field, the tables' width,
/// then each row's block table cut or padded to `width` blocks.
pub(super) fn input_layout(b: usize, rows: &[Row<'_>], width: usize) -> Vec<u32> {
    let mut host = Vec::with_capacity(FIELDS * b + 1 + b * width);
    for field in 0..FIELDS {
        host.extend(rows.iter().map(|r| r.fields[field]));
    }
    host.push(width as u32);
    for r in rows {
        let used = r.table.len().min(width);
        host.extend_from_slice(&r.table[..used]);
        host.extend(std::iter::repeat_n(0u32, width - used));
    }
    host
}

/// A padding row: no KV write, no context.
pub(super) fn padding() -> Row<'static> {
    Row {
        fields: [0, 0, u32::MAX, 0, 1],
        table: &[],
    }
}

/// Which graph of a bucket a capture makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    /// Plain decode.
    Decode,
    /// Decode with the rows' LoRA deltas.
    Lora,
    /// Verify steps: every row's KV written before any row attends.
    Verify,
    /// Plain decode of contexts that fit one cluster of the fused attention, on its
    /// tensor-core kernels (`KernelOptions::fused_mma`).
    Short,
    /// Plain decode of contexts past `KernelOptions::fused_long_ctx`: the attention unfused.
    Long,
}

/// How a step maps onto graph rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StepKind {
    /// Every sequence one decode token, its last logits.
    Decode,
    /// Some sequence has every row's logits (a verify step): one row per position.
    Verify,
}

/// Which kind of step `seqs` is, if a graph can replay it: each sequence either decodes one
/// token for its last logits, or asks for every row's logits (then one graph row per
/// position); `None` for anything else (a prefill chunk, a sequence without logits).
pub(super) fn step_kind(seqs: &[SeqInput<'_>]) -> Option<StepKind> {
    let mut kind = StepKind::Decode;
    for s in seqs {
        match s.logits {
            LogitRows::Last if s.q_len == 1 => {}
            LogitRows::All if s.q_len >= 1 => kind = StepKind::Verify,
            _ => return None,
        }
    }
    Some(kind)
}

/// The graph rows of `seqs` (one per token of `tokens`, in order): token, position, cache
/// slot, the context up to and including that position, and the block table it reads.
pub(super) fn step_rows<'a>(
    tokens: &[u32],
    seqs: &[SeqInput<'a>],
    block_size: usize,
    max_positions: usize,
) -> Result<Vec<Row<'a>>> {
    let (positions, slots) = positions_and_slots(tokens, seqs, block_size, max_positions)?;
    let mut rows = Vec::with_capacity(tokens.len());
    let mut i = 0;
    for s in seqs {
        for j in 0..s.q_len {
            let context = s.context_len - s.q_len + j + 1;
            let run = ((j as u32) << 16) | s.q_len as u32;
            rows.push(Row {
                fields: [tokens[i], positions[i], slots[i], context as u32, run],
                table: &s.block_table[..context.div_ceil(block_size)],
            });
            i += 1;
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decode row and a verify of three positions: each verify row's context ends at its
    /// own position and reads only the blocks up to it (mutation: every row given the
    /// sequence's whole context would attend to drafts after it).
    #[test]
    fn a_verified_sequence_becomes_one_row_per_position() {
        let (t1, t2) = ([7u32, 8], [3u32, 9, 4]);
        let seqs = [
            SeqInput {
                q_len: 1,
                context_len: 5,
                block_table: &t1,
                logits: LogitRows::Last,
                adapter: None,
            },
            SeqInput {
                q_len: 3,
                context_len: 10,
                block_table: &t2,
                logits: LogitRows::All,
                adapter: None,
            },
        ];
        assert_eq!(step_kind(&seqs), Some(StepKind::Verify));
        assert_eq!(step_kind(&seqs[..1]), Some(StepKind::Decode));
        let rows = step_rows(&[1, 2, 3, 4], &seqs, 4, 100).unwrap();
        let fields: Vec<[u32; FIELDS]> = rows.iter().map(|r| r.fields).collect();
        // Block size 4: position 4 of the first is its block 1 (8) slot 0; position 7 of the
        // second is block 1 (9) slot 3, position 8 block 2 (4) slot 0.
        assert_eq!(
            fields,
            vec![
                [1, 4, 8 * 4, 5, 1],
                [2, 7, 9 * 4 + 3, 8, 3],
                [3, 8, 4 * 4, 9, (1 << 16) | 3],
                [4, 9, 4 * 4 + 1, 10, (2 << 16) | 3]
            ]
        );
        let tables: Vec<&[u32]> = rows.iter().map(|r| r.table).collect();
        assert_eq!(tables, vec![&t1[..2], &t2[..2], &t2[..3], &t2[..3]]);
        let prefill = SeqInput {
            logits: LogitRows::Last,
            ..seqs[1]
        };
        assert_eq!(step_kind(&[prefill]), None);
    }
}
