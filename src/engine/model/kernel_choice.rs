//! Which attention kernels a decode step of the kernel forward takes, and the layer's
//! attention on them: the fused launch, its tensor-core loop for contexts that fit one
//! cluster (merged in clusters, or inside o with `attn_merge_o`), or the unfused kernels
//! (eager steps and the graphs of `crate::engine::runner::graphs` choose alike).

use candle_core::Tensor;

use super::attention::{AttnGroup, AttnPlan};
use super::kernel_buffers::{Activations, StepInputs};
use super::kernel_forward::KernelForward;
use super::kv_cache::PagedKvCache;
use crate::error::Result;

impl KernelForward<'_> {
    /// Whether a decode step of `rows` rows in `splits` partitions whose longest context is
    /// `max_ctx` may take the fused attention's tensor-core kernels
    /// ([`crate::engine::cuda::CudaKernels::fused_short_context`]).
    pub(crate) fn short_context(&self, rows: usize, splits: usize, max_ctx: usize) -> bool {
        self.model.layers.first().is_some_and(|l| {
            let g = l.attn.num_heads / l.attn.num_kv_heads.max(1);
            self.kernels.fused_short_context(rows, g, splits, max_ctx)
        })
    }

    /// Whether a pure decode step of `rows` rows runs each layer's attention as one fused
    /// launch (norm, RoPE, KV write and attention: rows must not read each other's KV).
    pub(crate) fn fuses_decode(&self, rows: usize) -> bool {
        self.model.layers.first().is_some_and(|l| {
            let at = &l.attn;
            self.kernels
                .fused_decode_supports(rows, at.num_heads, at.num_kv_heads, at.head_dim)
        })
    }

    /// Whether the step's attention runs as the fused decode launch: a pure decode step
    /// (every token a decode sequence, in order) of a batch the fused kernel takes.
    pub(crate) fn attention_fused(&self, inputs: &StepInputs, plan: &AttnPlan, t: usize) -> bool {
        !inputs.verify
            && !inputs.long_ctx
            && matches!(plan.groups.as_slice(),
            [AttnGroup::KernelDecode { n, first: 0 }] if *n == t)
            && self.fuses_decode(t)
    }

    /// Layer `li`'s attention from `acts.qkv`: the fused decode launch (`fused`), or the q/k
    /// norm + RoPE + KV write and then the attention kernels; returns the attention output.
    pub(crate) fn layer_attention(
        &self,
        li: usize,
        (inputs, acts, plan, cache): (&StepInputs, &Activations, &AttnPlan, &PagedKvCache),
        (fused, part, merge_o): (bool, usize, Option<usize>),
    ) -> Result<Tensor> {
        let (m, k, a) = (self.model, self.kernels, acts);
        let at = &m.layers[li].attn;
        let bs = cache.block_size();
        let mut kv = cache.layer(li);
        kv.fresh = a.kv_new.as_ref().map(|(k, v)| (k, v));
        let tables = (&inputs.tables, inputs.width.as_ref());
        let norms = (&at.q_norm.weight, &at.k_norm.weight, at.q_norm.eps);
        if let (Some(s), Some(scratch)) = (merge_o, a.scratch.as_ref()) {
            let (pos, slots) = (&inputs.pos, &inputs.slots);
            let parts = (s, scratch, &a.counters);
            k.decode_fused_partials_into(
                &a.qkv,
                norms,
                &m.inv_freq,
                (pos, slots),
                kv,
                tables,
                &inputs.ctx_lens,
                bs,
                &a.attn,
                parts,
            )?;
            return Ok(a.attn.clone());
        }
        Ok(if fused {
            k.decode_fused_into(
                &a.qkv,
                norms,
                &m.inv_freq,
                (&inputs.pos, &inputs.slots),
                kv,
                tables,
                &inputs.ctx_lens,
                bs,
                &a.attn,
                (inputs.splits, part, a.scratch.as_ref(), &a.counters),
                inputs.short_ctx,
            )?;
            a.attn.clone()
        } else {
            k.qk_norm_rope_kv_write_into(
                &a.qkv,
                (&at.q_norm.weight, &at.k_norm.weight),
                &m.inv_freq,
                (&inputs.pos, &inputs.slots),
                kv,
                (at.num_heads, at.num_kv_heads, at.head_dim),
                at.q_norm.eps,
                &a.q,
            )?;
            self.attend_kernels(kv, plan, inputs, acts, bs)?
        })
    }

    /// The attention partitions of a step whose o merges them (`attn_merge_o`, through
    /// [`crate::engine::cuda::CudaKernels::merge_o_splits`]): a fused (`fused`) 1-2-row step
    /// whose contexts fit one cluster, with scratch for the partials; else None.
    pub(crate) fn merge_o_splits(
        &self,
        inputs: &StepInputs,
        acts: &Activations,
        fused: bool,
    ) -> Result<Option<usize>> {
        let Some(l) = self.model.layers.first().filter(|_| fused) else {
            return Ok(None);
        };
        let (rows, heads) = (
            inputs.ctx_lens.elem_count(),
            (l.attn.num_heads, l.attn.num_kv_heads),
        );
        let Some(s) = self.kernels.merge_o_splits(rows, inputs.short_ctx, heads) else {
            return Ok(None);
        };
        let need = rows * l.attn.num_heads * s * l.attn.head_dim;
        Ok(acts
            .scratch
            .as_ref()
            .filter(|(acc, _)| acc.elem_count() >= need)
            .map(|_| s))
    }
}
