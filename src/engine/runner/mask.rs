//! Grammar masks on a step's logits: every token a row's grammar does not allow gets logit
//! -inf, before the repetition penalty's output reaches any draw (greedy, top-k, whole
//! vocabulary) or the log-probs, so all of them see only allowed tokens.
//!
//! On the engine's kernels the masks travel as bits (u32 words, bit `t % 32` of word `t / 32`)
//! and are applied in place on a copy the step owns (the logits may be a CUDA graph's output
//! buffer); elsewhere with candle ops.

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
        // The rows, then their masks, in one upload through pinned memory (the host does not
        // wait for the step's forward, which is still running).
        let m = masks.len();
        let mut host: Vec<u32> = Vec::with_capacity(m * (words + 1));
        host.extend(masks.iter().map(|(row, _)| *row as u32));
        for (_, mask) in masks {
            host.extend_from_slice(mask);
        }
        let up = k.upload_u32(&host)?;
        let out = super::sampler::owned_rows(k, logits)?;
        k.mask_tokens(
            &out,
            &up.narrow(0, m, m * words)?.reshape((m, words))?,
            &up.narrow(0, 0, m)?,
        )?;
        return Ok(out);
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
