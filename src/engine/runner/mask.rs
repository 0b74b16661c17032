//! Grammar masks on a step's logits: every token a row's grammar does not allow gets logit
//! -inf, before the repetition penalty's output reaches any draw (greedy, top-k, whole
//! vocabulary) or the log-probs, so all of them see only allowed tokens.
//!
//! On the engine's kernels the masks travel as bits (u32 words, bit `t % 32` of word `t / 32`)
//! and are applied in place (also on a CUDA graph's logits buffer: stream order keeps the next
//! replay's write behind this step's draw); elsewhere with candle ops.

use candle_core::Tensor;

use crate::engine::model::Model;
use crate::error::{Error, Result};

/// `logits` (f32 `[rows, vocab]`) with each `(row, mask)` applied; rows without a mask as
/// they are.
pub(crate) fn mask_logits(
    model: &Model,
    logits: &Tensor,
    masks: &[(usize, Vec<u32>)],
) -> Result<Tensor> {
    let (n_rows, vocab) = logits.dims2()?;
    let words = vocab.div_ceil(32);
    if let Some((row, m)) = masks
        .iter()
        .find(|(row, m)| *row >= n_rows || m.len() != words)
    {
        return Err(Error::Engine(format!(
            "a grammar mask of {} words for row {row} does not fit logits [{n_rows}, {vocab}]",
            m.len()
        )));
    }
    if masks.is_empty() {
        return Ok(logits.clone());
    }
    let dev = logits.device();
    #[cfg(feature = "cuda")]
    if let Some(k) = &model.kernels {
        // The spec, then the masks that allow more than one token, in one upload through
        // pinned memory (the host does not wait for the step's forward, which is still
        // running).
        let (host, kept) = pack(masks, words, vocab);
        let m = masks.len();
        let up = k.upload_u32(&host)?;
        // In place: the step's logits are read only by its draw and log-probs, which want
        // them masked, and the next write of a graph's logits buffer (the next step's replay)
        // is queued after them on the same stream. A copy of the rows cost a gather of
        // rows x vocab f32 a step (39 MB at batch 64).
        k.mask_tokens(
            logits,
            &up.narrow(0, 3 * m, kept * words)?.reshape((kept, words))?,
            &up.narrow(0, 0, 3 * m)?,
        )?;
        return Ok(logits.clone());
    }
    let _ = model;
    // One byte per token (1: allowed), then a select: whole words of the mask are copied
    // 32 bytes at a time (most words of a grammar's mask allow all or nothing).
    let mut keep = vec![1u8; n_rows * vocab];
    for (row, m) in masks {
        let row = &mut keep[row * vocab..(row + 1) * vocab];
        for (chunk, &w) in row.chunks_mut(32).zip(m) {
            match w {
                u32::MAX => {}
                0 => chunk.copy_from_slice(&[0u8; 32][..chunk.len()]),
                w => {
                    for (b, k) in chunk.iter_mut().enumerate() {
                        *k = ((w >> b) & 1) as u8;
                    }
                }
            }
        }
    }
    let keep = Tensor::from_vec(keep, (n_rows, vocab), dev)?;
    let ninf = Tensor::full(f32::NEG_INFINITY, (n_rows, vocab), dev)?;
    Ok(keep.where_cond(logits, &ninf)?)
}

/// The token a mask allows alone, if it allows exactly one.
#[cfg(any(feature = "cuda", test))]
fn single_token(mask: &[u32]) -> Option<u32> {
    let mut found = None;
    for (i, &w) in mask.iter().enumerate() {
        if w == 0 {
            continue;
        }
        if found.is_some() || !w.is_power_of_two() {
            return None;
        }
        found = Some(i as u32 * 32 + w.trailing_zeros());
    }
    found
}

/// The upload of [`mask_logits`] on the kernels (`CudaKernels::mask_tokens`): the spec (rows,
/// then each row's forced token or `u32::MAX`, then its mask's index among the masks sent),
/// then the masks that allow more than one token, `words` each; and how many of those. A
/// mask that allows one token (a grammar's forced token: most of a tool call's structure, and
/// end-of-sequence once the grammar is complete) travels as that token: 12 bytes instead of
/// the vocabulary's bits (19 KB for Qwen3's); one whose token lies past `vocab` (no logit)
/// travels as words, as before, and masks the whole row.
#[cfg(any(feature = "cuda", test))]
fn pack(masks: &[(usize, Vec<u32>)], words: usize, vocab: usize) -> (Vec<u32>, usize) {
    let n = masks.len();
    let forced: Vec<Option<u32>> = masks
        .iter()
        .map(|(_, m)| single_token(m).filter(|&t| (t as usize) < vocab))
        .collect();
    let kept = forced.iter().filter(|f| f.is_none()).count();
    let mut host = Vec::with_capacity(3 * n + kept * words);
    host.extend(masks.iter().map(|(row, _)| *row as u32));
    host.extend(forced.iter().map(|f| f.unwrap_or(u32::MAX)));
    let mut at = 0u32;
    for f in &forced {
        host.push(if f.is_none() { at } else { u32::MAX });
        at += u32::from(f.is_none());
    }
    for ((_, mask), f) in masks.iter().zip(&forced) {
        if f.is_none() {
            host.extend_from_slice(mask);
        }
    }
    (host, kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutations that fail it: a mask of two bits in one word taken as forced, the forced
    /// token's word index dropped (t % 32 only), forced rows' masks uploaded anyway, the
    /// mask indices counting the forced rows, a token past the vocabulary taken as forced.
    #[test]
    fn masks_of_one_token_travel_as_that_token() {
        let words = 4;
        let mut one = vec![0u32; words];
        one[2] = 1 << 5; // token 69
        let mut two_in_a_word = vec![0u32; words];
        two_in_a_word[1] = 0b101;
        let mut two_words = vec![0u32; words];
        two_words[0] = 1;
        two_words[3] = 1 << 31;
        assert_eq!(single_token(&one), Some(69));
        assert_eq!(single_token(&two_in_a_word), None);
        assert_eq!(single_token(&two_words), None);
        assert_eq!(single_token(&[0, 0, 0, 1 << 31]), Some(127));
        let masks = vec![
            (3, two_words.clone()),
            (0, one.clone()),
            (5, two_in_a_word.clone()),
        ];
        let (host, kept) = pack(&masks, words, 128);
        assert_eq!(kept, 2);
        assert_eq!(&host[..3], &[3, 0, 5], "rows");
        assert_eq!(&host[3..6], &[u32::MAX, 69, u32::MAX], "forced tokens");
        assert_eq!(&host[6..9], &[0, u32::MAX, 1], "mask indices");
        assert_eq!(&host[9..13], two_words.as_slice());
        assert_eq!(&host[13..], two_in_a_word.as_slice());
        // A vocabulary of 60 logits: token 69 has none, so its mask travels as words.
        let (host, kept) = pack(&[(0, one.clone())], words, 60);
        assert_eq!((kept, &host[..3]), (1, &[0, u32::MAX, 0][..]));
        assert_eq!(&host[3..], one.as_slice());
    }
}
