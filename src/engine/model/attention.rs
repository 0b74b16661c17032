//! Attention over the paged KV cache, behind one interface: [`AttnPlan`] (built once per
//! forward from the batch, shared by every layer) and [`attend`] (one layer's attention).
//!
//! This is the gather path, the candle-op implementation used on the CPU and as the reference
//! for the CUDA kernels: runs of decode sequences are batched with a padding mask, each prefill
//! sequence attends on its own with a causal mask, K/V are gathered by slot index from the
//! head-major cache. Queries come pre-scaled (1/sqrt(head_dim) is folded into q_norm).

use candle_core::{DType, Device, Tensor};

use crate::engine::batch::SeqInput;
use crate::engine::kv_format::{KvRef, dequantize};
use crate::error::Result;

/// How attention runs for one batch: runs of decode sequences batched with a padding mask,
/// each prefill sequence on its own with a causal mask. Built once per forward, shared by layers.
pub(crate) struct AttnPlan {
    pub(crate) groups: Vec<AttnGroup>,
}

pub(crate) enum AttnGroup {
    /// `n` consecutive one-token sequences that a decode kernel serves; `first` is the index
    /// of the first among the batch's one-token sequences (its row of the kernel's tables).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    KernelDecode { n: usize, first: usize },
    /// One sequence with `q_len` new tokens that the prefill kernel serves.
    KernelPrefill { q_len: usize },
    /// `n` consecutive one-token sequences; `idx` `[n * max_ctx]` slot indices, `mask` `[1, n, 1, max_ctx]`.
    Decode {
        n: usize,
        max_ctx: usize,
        idx: Tensor,
        mask: Option<Tensor>,
    },
    /// One sequence with `q_len` new tokens over `ctx` context tokens; causal `mask` `[q_len, ctx]`.
    Prefill {
        q_len: usize,
        ctx: usize,
        idx: Tensor,
        mask: Tensor,
    },
}

impl AttnPlan {
    /// The plan of a batch; with `decode_by_kernel`, runs of one-token sequences become
    /// [`AttnGroup::KernelDecode`], and with `prefill_by_kernel` other sequences become
    /// [`AttnGroup::KernelPrefill`] (no gather indices or masks are built for them).
    pub(crate) fn new(
        seqs: &[SeqInput<'_>],
        bs: usize,
        dev: &Device,
        dtype: DType,
        decode_by_kernel: bool,
        prefill_by_kernel: bool,
    ) -> Result<Self> {
        let slots_of = |s: &SeqInput<'_>, out: &mut Vec<u32>| {
            for p in 0..s.context_len {
                out.push(s.block_table[p / bs] * bs as u32 + (p % bs) as u32);
            }
        };
        let mut groups = Vec::new();
        let mut i = 0;
        let mut decode_seen = 0;
        while i < seqs.len() {
            if seqs[i].q_len == 1 {
                let mut j = i;
                while j < seqs.len() && seqs[j].q_len == 1 {
                    j += 1;
                }
                let run = &seqs[i..j];
                if decode_by_kernel {
                    groups.push(AttnGroup::KernelDecode {
                        n: run.len(),
                        first: decode_seen,
                    });
                    decode_seen += run.len();
                    i = j;
                    continue;
                }
                let max_ctx = run.iter().map(|s| s.context_len).max().unwrap_or(1);
                let mut idx = Vec::with_capacity(run.len() * max_ctx);
                let mut mask = Vec::with_capacity(run.len() * max_ctx);
                for s in run {
                    slots_of(s, &mut idx);
                    let pad = max_ctx - s.context_len;
                    idx.extend(std::iter::repeat_n(idx[idx.len() - 1], pad));
                    mask.extend(std::iter::repeat_n(0f32, s.context_len));
                    mask.extend(std::iter::repeat_n(f32::NEG_INFINITY, pad));
                }
                groups.push(AttnGroup::Decode {
                    n: run.len(),
                    max_ctx,
                    idx: Tensor::new(idx.as_slice(), dev)?,
                    // No padding (every context equally long, batch 1 among them): no mask.
                    mask: if run.iter().all(|s| s.context_len == max_ctx) {
                        None
                    } else {
                        Some(
                            Tensor::from_vec(mask, (1, run.len(), 1, max_ctx), dev)?
                                .to_dtype(dtype)?,
                        )
                    },
                });
                i = j;
            } else if prefill_by_kernel {
                groups.push(AttnGroup::KernelPrefill {
                    q_len: seqs[i].q_len,
                });
                i += 1;
            } else {
                let s = &seqs[i];
                let mut idx = Vec::with_capacity(s.context_len);
                slots_of(s, &mut idx);
                let start = s.context_len - s.q_len;
                let mask: Vec<f32> = (0..s.q_len)
                    .flat_map(|qi| {
                        (0..s.context_len).map(move |kj| {
                            if kj <= start + qi {
                                0.0
                            } else {
                                f32::NEG_INFINITY
                            }
                        })
                    })
                    .collect();
                groups.push(AttnGroup::Prefill {
                    q_len: s.q_len,
                    ctx: s.context_len,
                    idx: Tensor::new(idx.as_slice(), dev)?,
                    mask: Tensor::from_vec(mask, (s.q_len, s.context_len), dev)?.to_dtype(dtype)?,
                });
                i += 1;
            }
        }
        Ok(Self { groups })
    }
}

/// The gather path of paged attention: `q` `[T, heads, hd]` (post-RoPE) attends to the cached
/// K/V named by the plan (dequantized to q's dtype when the cache is fp8). Returns
/// `[T, heads * hd]`.
pub(crate) fn attend(
    q: &Tensor,
    kv: KvRef<'_>,
    plan: &AttnPlan,
    nh: usize,
    nkv: usize,
    hd: usize,
) -> Result<Tensor> {
    let mut outs = Vec::with_capacity(plan.groups.len());
    let mut t0 = 0;
    for group in &plan.groups {
        let n = group.tokens();
        outs.push(attend_group(
            &q.narrow(0, t0, n)?,
            kv,
            t0,
            group,
            nh,
            nkv,
            hd,
        )?);
        t0 += n;
    }
    let out = if outs.len() == 1 {
        outs.pop().expect("one group")
    } else {
        Tensor::cat(&outs, 0)?
    };
    Ok(out)
}

impl AttnGroup {
    /// Query tokens of the group.
    pub(crate) fn tokens(&self) -> usize {
        match self {
            Self::KernelDecode { n, .. } | Self::Decode { n, .. } => *n,
            Self::Prefill { q_len, .. } | Self::KernelPrefill { q_len } => *q_len,
        }
    }
}

/// One group of the gather path: `q` `[tokens, heads, hd]` holds the group's query rows,
/// rows `t0..` of the forward's (where an fp8 cache's `fresh` rows for them start).
pub(crate) fn attend_group(
    q: &Tensor,
    kv: KvRef<'_>,
    t0: usize,
    group: &AttnGroup,
    nh: usize,
    nkv: usize,
    hd: usize,
) -> Result<Tensor> {
    let g = nh / nkv;
    // The gathered rows in q's dtype (fp8: times the layer's scales).
    let k_rows = |idx: &Tensor| dequantize(&kv.k.index_select(idx, 1)?, kv.scale.k, q.dtype());
    let v_rows = |idx: &Tensor| dequantize(&kv.v.index_select(idx, 1)?, kv.scale.v, q.dtype());
    match group {
        AttnGroup::KernelDecode { .. } | AttnGroup::KernelPrefill { .. } => Err(
            crate::error::Error::Engine("a kernel group reached the gather path".into()),
        ),
        AttnGroup::Decode {
            n,
            max_ctx,
            idx,
            mask,
        } => {
            let (n, l) = (*n, *max_ctx);
            // One query token: the G query heads of a KV head become the "query length".
            let qg = q.reshape((n, nkv, g, hd))?.transpose(0, 1)?.contiguous()?; // [nkv, n, g, hd]
            // The head-major cache gathers straight into [nkv, n, l, hd]: no transpose.
            let k = k_rows(idx)?.reshape((nkv, n, l, hd))?;
            let v = v_rows(idx)?.reshape((nkv, n, l, hd))?;
            let scores = qg.matmul(&k.transpose(2, 3)?)?; // [nkv, n, g, l], q pre-scaled
            let scores = match mask {
                Some(m) => scores.broadcast_add(m)?,
                None => scores,
            };
            let p = candle_nn::ops::softmax_last_dim(&scores)?;
            let o = p.matmul(&v)?.transpose(0, 1)?.contiguous()?; // [n, nkv, g, hd]
            Ok(o.reshape((n, nh * hd))?)
        }
        AttnGroup::Prefill {
            q_len,
            ctx,
            idx,
            mask,
        } => {
            let (n, c) = (*q_len, *ctx);
            let qs = q.transpose(0, 1)?.contiguous()?.reshape((nkv, g * n, hd))?; // [nkv, g*n, hd]
            let (k, v) = match kv.fresh.filter(|_| kv.is_fp8()) {
                // The cached prefix from the fp8 cache, the chunk's own rows unrounded.
                Some((fk, fv)) => {
                    let prefix = idx.narrow(0, 0, c - n)?;
                    let own = |x: &Tensor| -> Result<Tensor> {
                        Ok(x.narrow(0, t0, n)?.transpose(0, 1)?.to_dtype(q.dtype())?)
                    };
                    (
                        Tensor::cat(&[k_rows(&prefix)?, own(fk)?], 1)?,
                        Tensor::cat(&[v_rows(&prefix)?, own(fv)?], 1)?,
                    )
                }
                None => (k_rows(idx)?, v_rows(idx)?), // [nkv, c, hd]
            };
            let scores = qs
                .matmul(&k.transpose(1, 2)?)?
                .reshape((nkv, g, n, c))?
                .broadcast_add(mask)?;
            let p = candle_nn::ops::softmax_last_dim(&scores)?.reshape((nkv, g * n, c))?;
            let o = p.matmul(&v)?.reshape((nh, n, hd))?.transpose(0, 1)?; // [n, nh, hd]
            Ok(o.contiguous()?.reshape((n, nh * hd))?)
        }
    }
}
