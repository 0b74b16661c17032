//! A layer's attention on the kernels in a step of [`KernelForward`]: the fused decode launch
//! (with the layer's add + norm + qkv inside under `KernelOptions::attn_qkv`), or the q/k
//! norm + RoPE + KV write and then the attention kernels.

use candle_core::Tensor;

use super::attention::AttnPlan;
use super::kernel_buffers::{Activations, StepInputs};
use super::kernel_forward::KernelForward;
use super::kv_cache::PagedKvCache;
use crate::error::Result;

impl KernelForward<'_> {
    /// Layer `li`'s attention from `acts.qkv`: the fused decode launch (`fused`), or the q/k
    /// norm + RoPE + KV write and then the attention kernels; returns the attention output.
    /// With `qkv_in` (the residual, delta and sum of the layer's input norm: the step runs
    /// `KernelOptions::attn_qkv`) the fused launch computes the qkv rows itself.
    pub(crate) fn layer_attention(
        &self,
        li: usize,
        (inputs, acts, plan, cache): (&StepInputs, &Activations, &AttnPlan, &PagedKvCache),
        (fused, part): (bool, usize),
        qkv_in: Option<(&Tensor, Option<&Tensor>, &Tensor)>,
    ) -> Result<Tensor> {
        let (m, k, a) = (self.model, self.kernels, acts);
        let (layer, at) = (&m.layers[li], &m.layers[li].attn);
        let bs = cache.block_size();
        let mut kv = cache.layer(li);
        kv.fresh = a.kv_new.as_ref().map(|(k, v)| (k, v));
        let norms = (&at.q_norm.weight, &at.k_norm.weight, at.q_norm.eps);
        let parts = (inputs.splits, part, a.scratch.as_ref(), &a.counters);
        let (pos, tables) = (
            (&inputs.pos, &inputs.slots),
            (&inputs.tables, inputs.width.as_ref()),
        );
        let (ctx, short) = (&inputs.ctx_lens, inputs.short_ctx);
        if !fused {
            k.qk_norm_rope_kv_write_into(
                &a.qkv,
                (&at.q_norm.weight, &at.k_norm.weight),
                &m.inv_freq,
                pos,
                kv,
                (at.num_heads, at.num_kv_heads, at.head_dim),
                at.q_norm.eps,
                &a.q,
            )?;
            return self.attend_kernels(kv, plan, inputs, acts, bs);
        }
        match qkv_in {
            Some(res) => {
                let norm = (&layer.input_norm.weight, layer.input_norm.eps);
                let qkv = (res, norm, at.qkv.weight());
                let inv = &m.inv_freq;
                k.decode_fused_qkv_into(
                    qkv, norms, inv, pos, kv, tables, ctx, bs, &a.attn, parts, short,
                )?
            }
            None => k.decode_fused_into(
                &a.qkv,
                norms,
                &m.inv_freq,
                pos,
                kv,
                tables,
                ctx,
                bs,
                &a.attn,
                parts,
                short,
            )?,
        }
        Ok(a.attn.clone())
    }
}
