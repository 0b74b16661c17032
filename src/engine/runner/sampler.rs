//! Sampling: greedy, or temperature / top-k / top-p with a per-request seed.
//!
//! Each sequence owns its RNG (SplitMix64 seeded by the request), so a request's samples do
//! not depend on what else is in the batch: same seed, same output.

use candle_core::Tensor;

use crate::engine::model::Model;
use crate::engine::request::SamplingParams;
use crate::error::Result;

/// How one row of a step's logits is drawn: the request's sampling and, for a sampled row,
/// the uniform number its request's generator gave for this step (the scheduler takes it, so
/// a request draws the same numbers whatever it shares a step with).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowDraw {
    /// The request's sampling.
    pub params: SamplingParams,
    /// The uniform number of a sampled row; `None`: greedy.
    pub uniform: Option<f32>,
}

/// The greedy token of each row of f32 `[rows, vocab]` logits, left where they are (argmax
/// on the device when the kernels run).
pub fn greedy_ids(model: &Model, logits: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if let Some(k) = &model.kernels {
        return k.argmax(logits);
    }
    let _ = model;
    Ok(logits.argmax(candle_core::D::Minus1)?)
}

/// See `ModelRunner::draw_ids`.
pub(crate) fn draw_ids(model: &Model, logits: &Tensor, rows: &[RowDraw]) -> Result<Tensor> {
    if rows.iter().all(|r| r.uniform.is_none()) {
        return greedy_ids(model, logits);
    }
    // A device draw serves every row when each sampled row's top_k is small enough.
    let device_k = rows
        .iter()
        .filter(|r| r.uniform.is_some())
        .map(|r| {
            r.params
                .top_k
                .filter(|&k| (1..=MAX_DEVICE_TOP_K).contains(&k) && r.params.min_p_cut().is_none())
        })
        .collect::<Option<Vec<usize>>>()
        .and_then(|ks| ks.into_iter().max());
    #[cfg(feature = "cuda")]
    if let (Some(k), Some(kern)) = (device_k, &model.kernels) {
        let mut params = Vec::with_capacity(rows.len() * 4);
        for r in rows {
            let p = &r.params;
            match r.uniform {
                None => params.extend([1.0, 1.0, 0.0, 1.0]),
                Some(u) => params.extend([
                    p.temperature,
                    p.top_p.unwrap_or(1.0),
                    u,
                    p.top_k.unwrap_or(k) as f32,
                ]),
            }
        }
        return kern.sample(logits, k, &params);
    }
    let _ = device_k;
    // Sampled rows over the whole vocabulary (no top-k, top-p off: what RL trainers send): one
    // device draw in token-id order (`CudaKernels::sample_full`).
    #[cfg(feature = "cuda")]
    if let Some(kern) = model.kernels.as_ref().filter(|k| k.samples_full())
        && rows
            .iter()
            .filter(|r| r.uniform.is_some())
            .all(|r| !r.params.cuts_vocabulary())
    {
        let mut params = Vec::with_capacity(rows.len() * 4);
        for r in rows {
            match r.uniform {
                None => params.extend([1.0, 1.0, 0.0, 1.0]),
                Some(u) => params.extend([r.params.temperature, 1.0, u, 0.0]),
            }
        }
        return kern.sample_full(logits, &params);
    }
    // Host sampling over whole rows (no kernels, or top_k absent or large).
    let greedy: Vec<u32> = greedy_ids(model, logits)?.to_vec1()?;
    let sampled: Vec<usize> = (0..rows.len())
        .filter(|&r| rows[r].uniform.is_some())
        .collect();
    let mut host = host_rows(model, logits, &sampled)?.into_iter();
    let mut ids = Vec::with_capacity(rows.len());
    for (row, r) in rows.iter().enumerate() {
        ids.push(match r.uniform {
            None => greedy[row],
            Some(u) => {
                let l = host.next().unwrap_or_default();
                sample_with(&l, &r.params, u)
            }
        });
    }
    Ok(Tensor::new(ids.as_slice(), logits.device())?)
}

/// Rows `rows` of f32 `[R, n]` logits, on the host. On the engine's kernels the rows are
/// gathered into a tensor of their own first: candle copies a CUDA tensor's whole storage
/// to the host, and a step's logits are often a view of a CUDA graph's static buffer
/// (`[largest bucket, vocab]`: 622 MB at 1,024 rows of Qwen3's vocabulary, ~0.5 s a copy on
/// an H200 host, once per sampled row).
pub(crate) fn host_rows(model: &Model, logits: &Tensor, rows: &[usize]) -> Result<Vec<Vec<f32>>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    #[cfg(feature = "cuda")]
    if let Some(k) = &model.kernels {
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = Tensor::new(idx.as_slice(), logits.device())?;
        return Ok(k.gather_rows_f32(logits, &idx)?.to_vec2()?);
    }
    let _ = model;
    rows.iter()
        .map(|&r| Ok(logits.get(r)?.to_vec1()?))
        .collect()
}

/// A copy of f32 `[R, n]` logits that a step may edit in place (a mask, a penalty): its `R`
/// rows alone (candle's `copy` of a view clones the whole storage it sits in: a graph's
/// `[largest bucket, vocab]` buffer every step).
#[cfg(feature = "cuda")]
pub(crate) fn owned_rows(k: &crate::engine::cuda::CudaKernels, logits: &Tensor) -> Result<Tensor> {
    k.gather_rows_f32(logits, &k.row_ids(logits.dim(0)?)?)
}

/// The entries a repetition penalty touches in `[n_rows, vocab]` logits: for each
/// `(row, penalty, tokens)` of a row that exists, the flat index of every distinct token in
/// the vocabulary, and the penalty for it.
fn penalty_entries(
    rows: &[(usize, f32, &[u32])],
    n_rows: usize,
    vocab: usize,
) -> (Vec<u32>, Vec<f32>) {
    let mut at: Vec<u32> = Vec::new();
    let mut penalty: Vec<f32> = Vec::new();
    for &(row, p, tokens) in rows.iter().filter(|r| r.0 < n_rows) {
        let mut seen: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| (t as usize) < vocab)
            .collect();
        seen.sort_unstable();
        seen.dedup();
        at.extend(seen.iter().map(|&t| (row * vocab) as u32 + t));
        penalty.extend(std::iter::repeat_n(p, seen.len()));
    }
    (at, penalty)
}

/// vLLM's repetition penalty on f32 `[rows, vocab]` logits, where they are: for each
/// `(row, penalty, tokens)`, the logit of every distinct token of `tokens` (the prompt and
/// output so far) is divided by `penalty` when positive, multiplied by it otherwise. Rows not
/// listed are left alone; nothing happens without a row.
pub(crate) fn apply_repetition_penalty(
    logits: &Tensor,
    rows: &[(usize, f32, &[u32])],
) -> Result<Tensor> {
    let (n_rows, vocab) = logits.dims2()?;
    let (at, penalty) = penalty_entries(rows, n_rows, vocab);
    if at.is_empty() {
        return Ok(logits.clone());
    }
    let dev = logits.device();
    let flat = logits.flatten_all()?;
    let at = Tensor::new(at.as_slice(), dev)?;
    let p = Tensor::new(penalty.as_slice(), dev)?;
    let old = flat.index_select(&at, 0)?;
    let new = old.gt(0f32)?.where_cond(&old.div(&p)?, &old.mul(&p)?)?;
    let out = flat.index_add(&at, &new.sub(&old)?, 0)?;
    Ok(out.reshape((n_rows, vocab))?)
}

/// [`apply_repetition_penalty`] on the engine's kernel where there is one (in place on a
/// copy the step owns: the logits may be a CUDA graph's output buffer), candle ops elsewhere.
pub(crate) fn penalize(
    model: &Model,
    logits: &Tensor,
    rows: &[(usize, f32, &[u32])],
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if let Some(k) = &model.kernels {
        let (n_rows, vocab) = logits.dims2()?;
        let (at, penalty) = penalty_entries(rows, n_rows, vocab);
        let out = owned_rows(k, logits)?;
        if !at.is_empty() {
            let dev = logits.device();
            k.repetition_penalty(
                &out,
                &Tensor::new(at.as_slice(), dev)?,
                &Tensor::new(penalty.as_slice(), dev)?,
            )?;
        }
        return Ok(out);
    }
    let _ = model;
    apply_repetition_penalty(logits, rows)
}

/// SplitMix64: small, fast, good enough for sampling.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// A uniform float in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// The `n`-th number (from 0) the generator gives from where it is, without moving it:
    /// `nth(0)` is the next [`Rng::next_f32`]. The engine draws a request's token at output
    /// position `n` with `nth(n)`, so a token's draw does not depend on how many steps
    /// produced the tokens before it (speculative steps verify several positions at once).
    pub fn nth(&self, n: u64) -> f32 {
        mix(self
            .0
            .wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(n.wrapping_add(1))))
    }
}

/// SplitMix64's output function, as a uniform float in [0, 1).
fn mix(state: u64) -> f32 {
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 24) as f32
}

/// Index of the largest value (the first on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The largest `top_k` a device may hand [`sample_candidates`] instead of a whole row.
pub const MAX_DEVICE_TOP_K: usize = 64;

/// Samples one token from `logits` under `params`, drawing from `rng`.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut Rng) -> u32 {
    sample_row(logits, params, || rng.next_f32())
}

/// [`sample`] with the uniform draw `u` given instead of a generator (a device draw takes the
/// request generator's next number on the host; this is the same draw on the host).
pub fn sample_with(logits: &[f32], params: &SamplingParams, u: f32) -> u32 {
    sample_row(logits, params, || u)
}

fn sample_row(logits: &[f32], params: &SamplingParams, uniform: impl FnOnce() -> f32) -> u32 {
    if params.is_greedy() || logits.is_empty() {
        return argmax(logits);
    }
    let cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (i as u32, v))
        .collect();
    if cand.is_empty() {
        return argmax(logits);
    }
    draw(cand, params, uniform)
}

/// [`sample`] over candidate `(token, logit)` pairs instead of a whole row: the same draw
/// when the candidates hold the row's `top_k` largest logits (a device hands over only those).
pub fn sample_candidates(cand: Vec<(u32, f32)>, params: &SamplingParams, rng: &mut Rng) -> u32 {
    draw(cand, params, || rng.next_f32())
}

/// The distribution a sampled row draws from: its finite candidates over the temperature
/// `t`, cut to the top-k, softmaxed, cut by min-p and by top-p, renormalized; most likely
/// first (lower id first on ties), with their probabilities. Empty without a finite
/// candidate. The draw and the log-probs of a cut row (`runner::logprobs`) both take it.
pub(crate) fn kept(
    cand: Vec<(u32, f32)>,
    params: &SamplingParams,
    t: f32,
) -> (Vec<(u32, f32)>, Vec<f32>) {
    let mut cand: Vec<(u32, f32)> = cand
        .into_iter()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, v)| (i, v / t))
        .collect();
    if cand.is_empty() {
        return (cand, Vec::new());
    }
    if let Some(k) = params.top_k.filter(|&k| k > 0 && k < cand.len()) {
        cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
        cand.truncate(k);
    }
    cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let max = cand[0].1;
    let mut probs: Vec<f32> = cand.iter().map(|(_, v)| (v - max).exp()).collect();
    let sum: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    // min-p, then top-p: each keeps a prefix of the sorted list and renormalizes.
    fn keep_prefix(probs: &mut Vec<f32>, keep: usize) {
        probs.truncate(keep);
        let s: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= s);
    }
    if let Some(m) = params.min_p_cut() {
        let first = probs[0];
        let keep = probs.iter().take_while(|&&q| q >= m * first).count().max(1);
        keep_prefix(&mut probs, keep);
    }
    if let Some(p) = params.top_p.filter(|p| *p > 0.0 && *p < 1.0) {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, q) in probs.iter().enumerate() {
            acc += q;
            if acc >= p {
                keep = i + 1;
                break;
            }
        }
        keep_prefix(&mut probs, keep);
    }
    cand.truncate(probs.len());
    (cand, probs)
}

/// The sampler's steps over candidates; `uniform` is called once, for the final draw.
fn draw(cand: Vec<(u32, f32)>, params: &SamplingParams, uniform: impl FnOnce() -> f32) -> u32 {
    if params.is_greedy() {
        let t = params.temperature;
        let mut cand: Vec<(u32, f32)> = cand
            .into_iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, v)| (i, v / t))
            .collect();
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        return cand.first().map_or(0, |c| c.0);
    }
    let (cand, probs) = kept(cand, params, params.temperature);
    if cand.is_empty() {
        return 0;
    }
    let r = uniform();
    let mut acc = 0.0;
    for (i, q) in probs.iter().enumerate() {
        acc += q;
        if r < acc {
            return cand[i].0;
        }
    }
    cand[probs.len() - 1].0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutations that fail it: penalizing a token once per occurrence (index_add with
    /// duplicates), multiplying positive logits, penalizing rows not listed.
    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
        let l = Tensor::new(
            &[[2.0f32, -1.0, 0.5, 3.0], [1.0, 1.0, 1.0, 1.0]],
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let tokens = [0u32, 1, 0, 0, 9];
        let out = apply_repetition_penalty(&l, &[(0, 2.0, &tokens)]).unwrap();
        let v: Vec<Vec<f32>> = out.to_vec2().unwrap();
        assert_eq!(v[0], vec![1.0, -2.0, 0.5, 3.0]);
        assert_eq!(v[1], vec![1.0; 4], "rows not listed are untouched");
        let same = apply_repetition_penalty(&l, &[]).unwrap();
        assert_eq!(same.to_vec2::<f32>().unwrap(), l.to_vec2::<f32>().unwrap());
    }

    /// `nth(n)` is the stream's n-th number (mutation: an index off by one fails).
    #[test]
    fn nth_is_the_streams_number_at_that_place() {
        let mut r = Rng::new(42);
        let fixed = r.clone();
        for n in 0..100 {
            assert_eq!(fixed.nth(n), r.next_f32(), "n = {n}");
        }
    }

    #[test]
    fn greedy_picks_the_max_and_first_on_ties() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(
            sample(
                &[0.1, 3.0, 2.0],
                &SamplingParams::greedy(),
                &mut Rng::new(1)
            ),
            1
        );
    }

    #[test]
    fn same_seed_same_samples_and_top_k_restricts() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 1.0,
            top_k: Some(5),
            top_p: Some(0.9),
            min_p: None,
            seed: 7,
        };
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..50)
                .map(|_| sample(&logits, &p, &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let mut top5: Vec<u32> = (0..100u32).collect();
        top5.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]));
        let top5 = &top5[..5];
        assert!(run(7).iter().all(|t| top5.contains(t)));
    }

    #[test]
    fn min_p_keeps_only_tokens_near_the_most_likely() {
        // Probabilities ~ 0.51, 0.46, 0.025, 0.009: min-p 0.5 keeps the first two.
        let logits = [3.0f32, 2.9, 0.0, -1.0];
        let with = |min_p| SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            min_p,
            seed: 1,
        };
        let draws = |p: SamplingParams| -> Vec<u32> {
            (0..1000)
                .map(|i| sample_with(&logits, &p, i as f32 / 1000.0))
                .collect()
        };
        let cut = draws(with(Some(0.5)));
        assert!(cut.iter().all(|&t| t < 2), "min-p 0.5 keeps tokens 0 and 1");
        assert!(cut.contains(&0) && cut.contains(&1));
        // Mutation (min-p ignored): the tail is drawn.
        assert!(draws(with(None)).iter().any(|&t| t >= 2));
        assert!(draws(with(Some(0.0))).iter().any(|&t| t >= 2), "0 is off");
    }

    #[test]
    fn sampling_from_the_top_k_candidates_equals_sampling_from_the_row() {
        let logits: Vec<f32> = (0..500)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.01)
            .collect();
        for (k, p) in [(20, None), (5, Some(0.8)), (64, Some(0.95))] {
            let params = SamplingParams {
                temperature: 0.7,
                top_k: Some(k),
                top_p: p,
                min_p: None,
                seed: 3,
            };
            let mut order: Vec<u32> = (0..500).collect();
            order.sort_by(|a, b| {
                logits[*b as usize]
                    .total_cmp(&logits[*a as usize])
                    .then(a.cmp(b))
            });
            let cand: Vec<(u32, f32)> = order[..64]
                .iter()
                .map(|&i| (i, logits[i as usize]))
                .collect();
            let (mut r1, mut r2) = (Rng::new(9), Rng::new(9));
            for _ in 0..200 {
                assert_eq!(
                    sample(&logits, &params, &mut r1),
                    sample_candidates(cand.clone(), &params, &mut r2)
                );
            }
        }
    }
}
