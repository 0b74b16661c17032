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

/// A decode graph's input layout (`rows` rows: token, position, cache slot, context length
/// and run, each a `[rows]` array, then the tables' width and each row's block table of
/// `width` blocks) advanced one token as a pipelined continuation has it: every one-token row
/// that writes the cache (slot not `u32::MAX`, run 1, a context) one position further, its
/// context one longer and its slot the new position's in its table (left as it was when the
/// table holds no block for it); tokens, tables and other rows as they are. The decode graphs'
/// argmax does the same to their inputs on the device (`KernelOptions::graph_advance`), in
/// u32 arithmetic that wraps as this does; a step whose layout equals this one needs no
/// upload. A layout too short for `rows` is left alone.
pub fn advance_decode_rows(layout: &mut [u32], rows: usize, block_size: usize) {
    if rows == 0 || block_size == 0 || layout.len() <= FIELDS * rows {
        return;
    }
    let width = layout[FIELDS * rows] as usize;
    let bs = block_size as u32;
    for r in 0..rows {
        let (pos, slot, ctx, run) = (
            layout[rows + r],
            layout[2 * rows + r],
            layout[3 * rows + r],
            layout[4 * rows + r],
        );
        if slot == u32::MAX || run != 1 || ctx == 0 {
            continue;
        }
        let p = pos.wrapping_add(1);
        let blk = (p / bs) as usize;
        if blk < width
            && let Some(&block) = layout.get(FIELDS * rows + 1 + r * width + blk)
        {
            layout[2 * rows + r] = block.wrapping_mul(bs).wrapping_add(p % bs);
        }
        layout[rows + r] = p;
        layout[3 * rows + r] = ctx.wrapping_add(1);
    }
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

    /// The host's layout of a pipelined continuation equals the step before's advanced by
    /// `advance_decode_rows` (what the graphs' argmax writes with `graph_advance`) while the
    /// sequences stay inside their tables' blocks, padding rows included, so those steps skip
    /// the upload; across a block boundary the width and the new block differ, so that step
    /// uploads. Mutations: a context not lengthened, a slot not moved, padding advanced, or
    /// the slot from the old block all fail the equalities.
    #[test]
    fn a_continuation_is_the_step_before_advanced() {
        let bs = 4;
        let (t1, t2) = ([7u32, 8, 2], [3u32, 9, 5]);
        let layout = |c1: usize, c2: usize, width: usize| {
            let seqs = [
                SeqInput {
                    q_len: 1,
                    context_len: c1,
                    block_table: &t1[..c1.div_ceil(bs)],
                    logits: LogitRows::Last,
                    adapter: None,
                },
                SeqInput {
                    q_len: 1,
                    context_len: c2,
                    block_table: &t2[..c2.div_ceil(bs)],
                    logits: LogitRows::Last,
                    adapter: None,
                },
            ];
            let mut rows = step_rows(&[11, 12], &seqs, bs, 100).unwrap();
            rows.resize(4, padding());
            input_layout(4, &rows, width)
        };
        // The layout of contexts c1 and c2 at `width`, moved on.
        let moved = |c1: usize, c2: usize, width: usize| {
            let mut l = layout(c1, c2, width);
            advance_decode_rows(&mut l, 4, bs);
            l
        };
        // Contexts 5 and 6 -> 6 and 7: both inside their second block.
        assert_eq!(moved(5, 6, 2)[4..], layout(6, 7, 2)[4..]);
        // 7 and 8 -> 8 and 9: the second crosses into its third block, which the step before's
        // table did not hold: the width grows and the block appears, so that step uploads.
        assert_ne!(moved(7, 8, 2)[4..], layout(8, 9, 3)[4..]);
        // The same crossing at a width that already had room: the new block still appears.
        assert_ne!(moved(8, 6, 3)[4..], layout(9, 7, 3)[4..]);
        // Past the crossing, inside the third block: equal again.
        assert_eq!(moved(9, 7, 3)[4..], layout(10, 8, 3)[4..]);
        // A verify row (run not 1: row 0 here) and the padding rows (2, 3) are left as they are;
        // row 1 moves one position (fields: positions at 4.., slots 8.., contexts 12..).
        let mut v = layout(5, 6, 2);
        v[4 * 4] = (1 << 16) | 3;
        let before = v.clone();
        advance_decode_rows(&mut v, 4, bs);
        for i in [4, 8, 12, 6, 7, 10, 11, 14, 15] {
            assert_eq!(v[i], before[i], "word {i}");
        }
        assert_eq!((v[5], v[13]), (before[5] + 1, before[13] + 1));
    }
}
