//! Which attention kernels a decode step of the kernel forward takes: the fused launch, its
//! tensor-core loop for contexts that fit one cluster, or the unfused kernels (eager steps
//! and the graphs of `crate::engine::runner::graphs` choose alike).

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

    /// Whether a fused decode step of `t` rows runs each layer's add + RMSNorm + qkv matmul
    /// inside its fused attention (`KernelOptions::fused_qkv`,
    /// [`crate::engine::cuda::CudaKernels::fused_qkv_serves`]): one row whose context fits one
    /// cluster, on a model the kernel serves. The caller adds: no LoRA, one rank, no trace.
    pub(crate) fn fuses_qkv(&self, inputs: &StepInputs, t: usize, cache: &PagedKvCache) -> bool {
        inputs.short_ctx
            && self.model.layers.first().is_some_and(|l| {
                let at = &l.attn;
                let k = at.qkv.weight().dims2().map_or(0, |d| d.1);
                let fp8 = cache.dtype() == candle_core::DType::F8E4M3;
                self.kernels.fused_qkv_serves(
                    t,
                    (at.num_heads, at.num_kv_heads, at.head_dim),
                    k,
                    fp8,
                )
            })
    }

    /// Layer `li`'s add + RMSNorm (`res`: residual, delta, the residual written), qkv matmul
    /// and fused decode attention in one launch
    /// ([`crate::engine::cuda::CudaKernels::decode_fused_qkv_into`]); returns the attention
    /// output, as [`KernelForward::layer_attention`] does.
    pub(crate) fn layer_attention_qkv(
        &self,
        li: usize,
        res: (&Tensor, Option<&Tensor>, &Tensor),
        (inputs, acts, cache): (&StepInputs, &Activations, &PagedKvCache),
        part: usize,
    ) -> Result<Tensor> {
        let (m, a) = (self.model, acts);
        let layer = &m.layers[li];
        let at = &layer.attn;
        let kv = cache.layer(li);
        self.kernels.decode_fused_qkv_into(
            res,
            (&layer.input_norm.weight, layer.input_norm.eps),
            at.qkv.weight(),
            (&at.q_norm.weight, &at.k_norm.weight, at.q_norm.eps),
            &m.inv_freq,
            (&inputs.pos, &inputs.slots),
            kv,
            (&inputs.tables, inputs.width.as_ref()),
            &inputs.ctx_lens,
            cache.block_size(),
            &a.attn,
            (inputs.splits, part, a.scratch.as_ref(), &a.counters),
        )?;
        Ok(a.attn.clone())
    }
}
