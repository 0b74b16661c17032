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
        let first = self.layers.first().map(|l| &l.attn);
        let group = first.map_or(1, |a| a.num_heads / a.num_kv_heads.max(1));
        let prefill_kernel = k.prefill_supports(group);
        let tile = k.prefill_tile(group);
        let decode: Vec<&SeqInput<'_>> = seqs.iter().filter(|s| s.q_len == 1).collect();
        let width = decode
            .iter()
            .map(|s| s.context_len.div_ceil(bs))
            .max()
            .unwrap_or(0);
        // One upload: ids | positions | slots | decode context lengths | decode block tables |
        // prefill tiles | prefill sequence metadata | prefill block tables.
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
        let (mut tiles, mut meta, mut ptables) = (Vec::new(), Vec::new(), Vec::new());
        if prefill_kernel {
            let mut row = 0u32;
            for s in seqs {
                if s.q_len > 1 {
                    let idx = (meta.len() / 4) as u32;
                    for q0 in (0..s.q_len).step_by(tile) {
                        tiles.extend([idx, q0 as u32]);
                    }
                    let used = s.context_len.div_ceil(bs);
                    meta.extend([
                        row,
                        s.q_len as u32,
                        s.context_len as u32,
                        ptables.len() as u32,
                    ]);
                    ptables.extend_from_slice(&s.block_table[..used]);
                }
                row += s.q_len as u32;
            }
        }
        let pre_at = packed.len();
        packed.extend_from_slice(&tiles);
        packed.extend_from_slice(&meta);
        packed.extend_from_slice(&ptables);
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
        let (tiles_t, meta_t, ptables_t) = if tiles.is_empty() {
            (ids.clone(), ids.clone(), ids.clone())
        } else {
            (
                packed.narrow(0, pre_at, tiles.len())?,
                packed.narrow(0, pre_at + tiles.len(), meta.len())?,
                packed.narrow(0, pre_at + tiles.len() + meta.len(), ptables.len())?,
            )
        };
        let plan = AttnPlan::new(seqs, bs, dev, self.dtype(), true, prefill_kernel)?;

        // The residual stream: one buffer of this forward's own, updated in place. The
        // activations get one buffer each per forward, reused by every layer: on one stream a
        // layer's writes come after the previous layer's reads of the same buffer.
        let residual = k.embedding(&self.embed, &ids)?; // [T, hidden]
        let Some(l0) = self.layers.first() else {
            return Err(crate::error::Error::Engine("a model without layers".into()));
        };
        let (nh, nkv, hd) = (l0.attn.num_heads, l0.attn.num_kv_heads, l0.attn.head_dim);
        let scratch = k.decode_scratch(nd, nh, width, bs)?;
        let h = k.alloc_out(residual.shape().clone())?;
        let q = k.alloc_out((t, nh, hd))?;
        let attn = k.alloc_out((t, nh * hd))?;
        let act = k.alloc_out((t, l0.mlp.intermediate))?;
        let mut delta: Option<Tensor> = None;
        for (li, layer) in self.layers.iter().enumerate() {
            let a = &layer.attn;
            k.add_rmsnorm_into(
                delta.as_ref(),
                &residual,
                &layer.input_norm.weight,
                layer.input_norm.eps,
                &h,
            )?;
            let qkv = a.qkv.forward(&h)?;
            let (kc, vc) = cache.layer(li);
            k.qk_norm_rope_kv_write_into(
                &qkv,
                (&a.q_norm.weight, &a.k_norm.weight),
                &self.inv_freq,
                (&pos, &slot_t),
                (kc, vc),
                (nh, nkv, hd),
                a.q_norm.eps,
                &q,
            )?;
            let out = self.attend_kernels(
                k,
                &q,
                (kc, vc),
                &plan,
                (&tables, &ctx_lens, scratch.as_ref()),
                (&tiles_t, &meta_t, &ptables_t),
                bs,
                &attn,
            )?;
            let o = reduce(a.o_proj.forward(&out)?, comm)?;
            k.add_rmsnorm_into(
                Some(&o),
                &residual,
                &layer.post_norm.weight,
                layer.post_norm.eps,
                &h,
            )?;
            let gu = layer.mlp.gate_up.forward(&h)?;
            k.silu_mul_into(&gu, &act)?;
            delta = Some(reduce(layer.mlp.down.forward(&act)?, comm)?);
        }
        let rows = Self::logit_rows(seqs);
        if rows.is_empty() || self.shard().rank != 0 {
            return Ok(None);
        }
        let hn = k.add_rmsnorm(delta.as_ref(), &residual, &self.norm.weight, self.norm.eps)?;
        let sel = if rows.len() == t {
            hn
        } else {
            k.gather_rows(&hn, &Tensor::new(rows.as_slice(), dev)?)?
        };
        let logits = self.lm_head.forward(&sel)?;
        Ok(Some(k.to_f32(&logits)?))
    }

    /// One layer's attention on the kernels: every group writes its rows of one `[T, nh * hd]`
    /// output (decode runs through the decode kernel, all prefill chunks through one prefill
    /// launch); groups the kernels do not serve go through the gather path.
    #[allow(clippy::too_many_arguments)]
    fn attend_kernels(
        &self,
        k: &CudaKernels,
        q: &Tensor,
        (kc, vc): (&Tensor, &Tensor),
        plan: &AttnPlan,
        (tables, ctx_lens, scratch): (&Tensor, &Tensor, Option<&(Tensor, Tensor)>),
        (tiles, meta, ptables): (&Tensor, &Tensor, &Tensor),
        bs: usize,
        out: &Tensor,
    ) -> Result<Tensor> {
        let (t, nh, hd) = q.dims3()?;
        let all_kernel = plan.groups.iter().all(|g| {
            matches!(
                g,
                AttnGroup::KernelDecode { .. } | AttnGroup::KernelPrefill { .. }
            )
        });
        if all_kernel {
            let _ = (t, nh, hd);
            let mut t0 = 0;
            let mut prefill = false;
            for g in &plan.groups {
                let n = g.tokens();
                match g {
                    AttnGroup::KernelDecode { n, first } => k.paged_decode_into(
                        &q.narrow(0, t0, *n)?,
                        kc,
                        vc,
                        &tables.narrow(0, *first, *n)?,
                        &ctx_lens.narrow(0, *first, *n)?,
                        bs,
                        &out.narrow(0, t0, *n)?,
                        scratch,
                    )?,
                    _ => prefill = true,
                }
                t0 += n;
            }
            if prefill {
                k.paged_prefill_into(q, kc, vc, tiles, meta, ptables, bs, out)?;
            }
            return Ok(out.clone());
        }
        let a = &self.layers[0].attn;
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
                other => attend_group(&qg, kc, vc, other, nh, a.num_kv_heads, hd)?,
            });
            t0 += n;
        }
        Ok(if outs.len() == 1 {
            outs.pop().expect("one group")
        } else {
            Tensor::cat(&outs, 0)?
        })
    }
}
