//! Log-probabilities of drawn tokens ([`GenerationRequest::logprobs`]), in the distribution
//! each token was drawn from: the logits over the temperature (1 for greedy rows),
//! renormalized over the tokens top-k / min-p / top-p keep (the others get none: `-inf`).
//!
//! Rows without top-k / top-p (what RL trainers send) are computed where the logits are (on
//! the GPU: a log-softmax of the scaled rows, the drawn token's entry gathered, the top `k`
//! by the device top-k kernel); only `rows x (1 + 2k)` numbers reach the host. Rows with
//! top-k / top-p read their logits to the host and repeat the sampler's cut there.
//!
//! [`GenerationRequest::logprobs`]: crate::engine::GenerationRequest::logprobs

use candle_core::{D, DType, Tensor};

use crate::engine::model::Model;
use crate::engine::request::{SamplingParams, TokenLogprob};
use crate::error::Result;

/// One row whose drawn token wants its log-probability: the row of the step's logits, its
/// request's sampling and how many alternatives it asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogprobRow {
    /// Row of the logits (and of the drawn ids).
    pub row: usize,
    /// The request's sampling.
    pub params: SamplingParams,
    /// Alternatives asked for.
    pub k: usize,
}

/// Whether top-k / top-p / min-p cut this row's distribution (greedy rows never: their
/// log-probs are the model's own distribution).
fn filtered(p: &SamplingParams) -> bool {
    !p.is_greedy() && p.cuts_vocabulary()
}

/// The temperature a row's log-probs are taken at.
fn temperature(p: &SamplingParams) -> f32 {
    if p.is_greedy() { 1.0 } else { p.temperature }
}

/// The log-probabilities of `rows` (one [`TokenLogprob`] each, in order) for the f32 logits
/// `[n, vocab]` and the ids drawn from them, on the device (u32 `[n]`) and already read to
/// the host (`drawn`).
pub(crate) fn logprobs(
    model: &Model,
    logits: &Tensor,
    (ids, drawn): (&Tensor, &[u32]),
    rows: &[LogprobRow],
) -> Result<Vec<TokenLogprob>> {
    let mut out: Vec<Option<TokenLogprob>> = vec![None; rows.len()];
    let (whole, cut): (Vec<usize>, Vec<usize>) =
        (0..rows.len()).partition(|&i| !filtered(&rows[i].params));
    #[cfg(feature = "cuda")]
    let whole = match launch_on_kernels(model, logits, ids, rows, &whole)? {
        Some(launched) => {
            for (i, lp) in launched.finish(drawn, rows)? {
                out[i] = Some(lp);
            }
            Vec::new()
        }
        None => whole,
    };
    if !whole.is_empty() {
        let dev = logits.device();
        let idx: Vec<u32> = whole.iter().map(|&i| rows[i].row as u32).collect();
        let idx = Tensor::new(idx.as_slice(), dev)?;
        let inv_t: Vec<f32> = whole
            .iter()
            .map(|&i| 1.0 / temperature(&rows[i].params))
            .collect();
        let inv_t = Tensor::from_vec(inv_t, (whole.len(), 1), dev)?;
        let scaled = logits.index_select(&idx, 0)?.broadcast_mul(&inv_t)?;
        let lsm = candle_nn::ops::log_softmax(&scaled, D::Minus1)?;
        let chosen: Vec<f32> = lsm
            .gather(&ids.index_select(&idx, 0)?.unsqueeze(1)?.contiguous()?, 1)?
            .flatten_all()?
            .to_vec1()?;
        let kmax = whole.iter().map(|&i| rows[i].k).max().unwrap_or(0);
        let top = top_k(model, &lsm, kmax)?;
        for (j, &i) in whole.iter().enumerate() {
            out[i] = Some(TokenLogprob {
                token: drawn[rows[i].row],
                logprob: chosen[j],
                top: top
                    .get(j)
                    .map(|t| t[..rows[i].k.min(t.len())].to_vec())
                    .unwrap_or_default(),
            });
        }
    }
    let cut_rows: Vec<usize> = cut.iter().map(|&i| rows[i].row).collect();
    let host = super::sampler::host_rows(model, logits, &cut_rows)?;
    for (i, row) in cut.into_iter().zip(host) {
        let r = &rows[i];
        out[i] = Some(cut_logprobs(&row, &r.params, drawn[r.row], r.k));
    }
    Ok(out.into_iter().flatten().collect())
}

/// Log-probs launched on the device and on their way to the host (the whole-vocabulary rows
/// of a step, on the engine's kernels): read them with [`OnDevice::finish`], after the step's
/// ids, without waiting for work queued after them (a pipelined next step).
#[cfg(feature = "cuda")]
pub(crate) struct OnDevice {
    /// Indices into the rows asked for.
    whole: Vec<usize>,
    inv_t: Vec<f32>,
    /// Per row: log-sum-exp and the drawn token's log-prob (f32 bits).
    lp: crate::engine::cuda::PendingIds,
    /// The top `kmax` raw logits per row and their ids (f32 bits, u32), when any row asks.
    top: Option<(
        crate::engine::cuda::PendingIds,
        crate::engine::cuda::PendingIds,
        usize,
    )>,
}

/// Launches the log-probs of rows `whole` (indices into `rows`, whole-vocabulary rows) on
/// the engine's kernels: one pass a row for the log-sum-exp and the drawn token's entry
/// (`logprob_rows_f32`, reading the drawn ids where the draw left them), the top `k` by the
/// device top-k of the raw logits (the same order as the scaled ones), each queued to the
/// host. `None` without kernels.
#[cfg(feature = "cuda")]
fn launch_on_kernels(
    model: &Model,
    logits: &Tensor,
    ids: &Tensor,
    rows: &[LogprobRow],
    whole: &[usize],
) -> Result<Option<OnDevice>> {
    let Some(kern) = &model.kernels else {
        return Ok(None);
    };
    let dev = logits.device();
    let idx: Vec<u32> = whole.iter().map(|&i| rows[i].row as u32).collect();
    let inv_t: Vec<f32> = whole
        .iter()
        .map(|&i| 1.0 / temperature(&rows[i].params))
        .collect();
    let idx_t = Tensor::new(idx.as_slice(), dev)?;
    let lp = kern.logprob_rows(logits, &idx_t, &Tensor::new(inv_t.as_slice(), dev)?, ids)?;
    let lp = kern.read_bits(&lp)?;
    let kmax = whole.iter().map(|&i| rows[i].k).max().unwrap_or(0);
    let top = if kmax == 0 || whole.is_empty() {
        None
    } else {
        let all_in_order =
            idx.len() == logits.dim(0)? && idx.iter().enumerate().all(|(j, &r)| r as usize == j);
        let sel = if all_in_order {
            logits.clone()
        } else {
            kern.gather_rows_f32(logits, &idx_t)?
        };
        let (vals, top_ids) = kern.topk(&sel.contiguous()?, kmax)?;
        let k = vals.dim(1)?;
        Some((kern.read_bits(&vals)?, kern.read_bits(&top_ids)?, k))
    };
    Ok(Some(OnDevice {
        whole: whole.to_vec(),
        inv_t,
        lp,
        top,
    }))
}

#[cfg(feature = "cuda")]
impl OnDevice {
    /// Waits for the launched log-probs (`drawn`: the step's ids, read) and returns them by
    /// index into `rows`.
    pub(crate) fn finish(
        self,
        drawn: &[u32],
        rows: &[LogprobRow],
    ) -> Result<Vec<(usize, TokenLogprob)>> {
        let lp: Vec<f32> = self.lp.wait()?.into_iter().map(f32::from_bits).collect();
        let top: Option<(Vec<f32>, Vec<u32>, usize)> = match self.top {
            None => None,
            Some((v, i, k)) => Some((
                v.wait()?.into_iter().map(f32::from_bits).collect(),
                i.wait()?,
                k,
            )),
        };
        Ok(self
            .whole
            .iter()
            .enumerate()
            .map(|(j, &i)| {
                let (lse, it) = (lp[2 * j], self.inv_t[j]);
                let k = rows[i].k;
                let top = top
                    .as_ref()
                    .map(|(v, ids, kk)| {
                        (0..k.min(*kk))
                            .map(|c| (ids[j * kk + c], v[j * kk + c] * it - lse))
                            .collect()
                    })
                    .unwrap_or_default();
                (
                    i,
                    TokenLogprob {
                        token: drawn[rows[i].row],
                        logprob: lp[2 * j + 1],
                        top,
                    },
                )
            })
            .collect())
    }
}

/// Log-probs of a step asked for before its ids are read (pipelined decode): on the device
/// and on their way to the host, or (no kernels) computed already.
pub(crate) enum Pending {
    /// Computed with the ids read (the candle path).
    Ready(Vec<TokenLogprob>),
    /// Launched on the engine's kernels.
    #[cfg(feature = "cuda")]
    Device(Box<OnDevice>),
}

/// Whether a row's log-probs can be taken on the device without its logits on the host
/// (its distribution is the whole vocabulary: no top-k / top-p / min-p cut).
pub(crate) fn on_device(p: &SamplingParams) -> bool {
    !filtered(p)
}

/// Starts the log-probs of `rows` (every one [`on_device`]) for the step's logits and the
/// ids drawn from them (on the device, not read yet).
pub(crate) fn launch(
    model: &Model,
    logits: &Tensor,
    ids: &Tensor,
    rows: &[LogprobRow],
) -> Result<Pending> {
    #[cfg(feature = "cuda")]
    {
        let all: Vec<usize> = (0..rows.len()).collect();
        if rows.iter().all(|r| on_device(&r.params))
            && let Some(d) = launch_on_kernels(model, logits, ids, rows, &all)?
        {
            return Ok(Pending::Device(Box::new(d)));
        }
    }
    let drawn: Vec<u32> = ids.to_vec1()?;
    Ok(Pending::Ready(logprobs(
        model,
        logits,
        (ids, &drawn),
        rows,
    )?))
}

impl Pending {
    /// The log-probs of the rows launched, in order, once the step's ids (`drawn`) are read.
    pub(crate) fn finish(self, drawn: &[u32], rows: &[LogprobRow]) -> Result<Vec<TokenLogprob>> {
        let _ = (drawn, rows);
        match self {
            Pending::Ready(v) => Ok(v),
            #[cfg(feature = "cuda")]
            Pending::Device(d) => Ok(d
                .finish(drawn, rows)?
                .into_iter()
                .map(|(_, lp)| lp)
                .collect()),
        }
    }
}

/// The `k` largest entries of each row of f32 `x` (`[n, vocab]`), largest first (lower id
/// first on ties), as `(id, value)`; empty rows for `k` 0.
fn top_k(model: &Model, x: &Tensor, k: usize) -> Result<Vec<Vec<(u32, f32)>>> {
    let n = x.dim(0)?;
    if k == 0 {
        return Ok(vec![Vec::new(); n]);
    }
    #[cfg(feature = "cuda")]
    if let Some(kern) = &model.kernels {
        let (vals, ids) = kern.topk(&x.contiguous()?, k)?;
        let (vals, ids): (Vec<Vec<f32>>, Vec<Vec<u32>>) = (vals.to_vec2()?, ids.to_vec2()?);
        return Ok(ids
            .into_iter()
            .zip(vals)
            .map(|(i, v)| i.into_iter().zip(v).collect())
            .collect());
    }
    let _ = model;
    let rows: Vec<Vec<f32>> = x.to_dtype(DType::F32)?.to_vec2()?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let mut idx: Vec<u32> = (0..row.len() as u32).collect();
            let k = k.min(idx.len());
            let cmp =
                |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
            if k < idx.len() {
                idx.select_nth_unstable_by(k - 1, cmp);
                idx.truncate(k);
            }
            idx.sort_unstable_by(cmp);
            idx.into_iter().map(|i| (i, row[i as usize])).collect()
        })
        .collect())
}

/// The log-probabilities of a row cut by top-k / min-p / top-p, on the host: the distribution
/// the sampler draws from (`sampler::kept`); tokens outside it get `-inf`.
pub fn cut_logprobs(logits: &[f32], p: &SamplingParams, token: u32, k: usize) -> TokenLogprob {
    let cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, v))
        .collect();
    let (cand, probs) = super::sampler::kept(cand, p, temperature(p));
    let logprob = cand
        .iter()
        .position(|c| c.0 == token)
        .map_or(f32::NEG_INFINITY, |i| probs[i].ln());
    let top = cand
        .iter()
        .zip(&probs)
        .take(k)
        .map(|(c, &q)| (c.0, q.ln()))
        .collect();
    TokenLogprob {
        token,
        logprob,
        top,
    }
}
