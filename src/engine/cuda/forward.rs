//! The Qwen3 forward on the engine's own kernels: per layer one fused add+RMSNorm, the fused
//! q/k norm + RoPE + KV write, paged decode attention, SiLU*up, and four cuBLAS matmuls
//! (qkv, o, gate|up, down) — about 9 launches per layer instead of ~28 candle ops.
//!
//! Invariant: the step's integer inputs (token ids, positions, cache slots, the decode
//! sequences' context lengths and block tables) go to the device in one upload; nothing in
//! the layer loop copies from the host. Prefill chunks still attend through the gather path
//! (`super::super::attention`), reading the cache the fused kernel wrote.

use candle_core::{Module, Tensor};

use super::CudaKernels;
use crate::engine::attention::{AttnGroup, AttnPlan, attend_group};
use crate::engine::comm::CommBackend;
use crate::engine::kv_cache::PagedKvCache;
use crate::engine::qwen3::{Qwen3, SeqInput};
use crate::error::Result;

/// Sums a row-parallel partial output over the ranks (no-op on one rank).
fn reduce(partial: Tensor, comm: Option<&dyn CommBackend>) -> Result<Tensor> {
    match comm {
        Some(c) if c.world_size() > 1 => c.all_reduce_sum(&partial),
        _ => Ok(partial),
    }
}

impl Qwen3 {
    /// [`Qwen3::forward`] on the kernels (same inputs, same outputs).
    pub(crate) fn forward_kernels(
        &self,
        k: &CudaKernels,
        tokens: &[u32],
        seqs: &[SeqInput<'_>],
        cache: &PagedKvCache,
        comm: Option<&dyn CommBackend>,
    ) -> Result<Option<Tensor>> {
        let bs = cache.block_size();
        let (positions, slots) = self.batch_slots(tokens, seqs, bs)?;
        let t = tokens.len();
        let decode: Vec<&SeqInput<'_>> = seqs.iter().filter(|s| s.q_len == 1).collect();
        let width = decode
            .iter()
            .map(|s| s.context_len.div_ceil(bs))
            .max()
            .unwrap_or(0);
        // One upload: ids | positions | slots | decode context lengths | decode block tables.
        let mut packed = Vec::with_capacity(3 * t + decode.len() * (1 + width));
        packed.extend_from_slice(tokens);
        packed.extend_from_slice(&positions);
        packed.extend_from_slice(&slots);
        packed.extend(decode.iter().map(|s| s.context_len as u32));
        for s in &decode {
            let used = s.context_len.div_ceil(bs);
            packed.extend_from_slice(&s.block_table[..used]);
            packed.extend(std::iter::repeat_n(0u32, width - used));
        }
        let dev = self.device();
        let packed = Tensor::new(packed.as_slice(), dev)?;
        let ids = packed.narrow(0, 0, t)?;
        let pos = packed.narrow(0, t, t)?;
        let slot_t = packed.narrow(0, 2 * t, t)?;
        let nd = decode.len();
        let (ctx_lens, tables) = if nd > 0 {
            (
                packed.narrow(0, 3 * t, nd)?,
                packed
                    .narrow(0, 3 * t + nd, nd * width)?
                    .reshape((nd, width))?,
            )
        } else {
            (ids.clone(), ids.clone())
        };
        let plan = AttnPlan::new(seqs, bs, dev, self.dtype(), true)?;

        let mut residual = self.embed.index_select(&ids, 0)?; // [T, hidden]
        let mut delta: Option<Tensor> = None;
        for (li, layer) in self.layers.iter().enumerate() {
            let a = &layer.attn;
            let (h, r) = k.add_rmsnorm(
                delta.as_ref(),
                &residual,
                &layer.input_norm.weight,
                layer.input_norm.eps,
            )?;
            residual = r;
            let qkv = a.qkv.forward(&h)?;
            let (kc, vc) = cache.layer(li);
            let q = k.qk_norm_rope_kv_write(
                &qkv,
                &a.q_norm.weight,
                &a.k_norm.weight,
                &self.inv_freq,
                &pos,
                &slot_t,
                kc,
                vc,
                (a.num_heads, a.num_kv_heads, a.head_dim),
                a.q_norm.eps,
            )?;
            let mut outs = Vec::with_capacity(plan.groups.len());
            let mut t0 = 0;
            for g in &plan.groups {
                let n = g.tokens();
                let qg = q.narrow(0, t0, n)?;
                outs.push(match g {
                    AttnGroup::KernelDecode { n, first } => k.paged_decode(
                        &qg,
                        kc,
                        vc,
                        &tables.narrow(0, *first, *n)?,
                        &ctx_lens.narrow(0, *first, *n)?,
                        bs,
                    )?,
                    other => {
                        attend_group(&qg, kc, vc, other, a.num_heads, a.num_kv_heads, a.head_dim)?
                    }
                });
                t0 += n;
            }
            let attn = if outs.len() == 1 {
                outs.pop().expect("one group")
            } else {
                Tensor::cat(&outs, 0)?
            };
            let o = reduce(a.o_proj.forward(&attn)?, comm)?;
            let (h, r) = k.add_rmsnorm(
                Some(&o),
                &residual,
                &layer.post_norm.weight,
                layer.post_norm.eps,
            )?;
            residual = r;
            let gu = layer.mlp.gate_up.forward(&h)?;
            let act = k.silu_mul(&gu)?;
            delta = Some(reduce(layer.mlp.down.forward(&act)?, comm)?);
        }
        let rows = Self::logit_rows(seqs);
        if rows.is_empty() || self.shard().rank != 0 {
            return Ok(None);
        }
        let (hn, _) = k.add_rmsnorm(delta.as_ref(), &residual, &self.norm.weight, self.norm.eps)?;
        let sel = if rows.len() == t {
            hn
        } else {
            hn.index_select(&Tensor::new(rows.as_slice(), dev)?, 0)?
        };
        let logits = self.lm_head.forward(&sel)?;
        Ok(Some(logits.to_dtype(candle_core::DType::F32)?))
    }
}
