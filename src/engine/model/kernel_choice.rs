//! Which attention kernels a decode step of the kernel forward takes: the fused launch, its
//! tensor-core loop for contexts that fit one cluster, or the unfused kernels (eager steps
//! and the graphs of `crate::engine::runner::graphs` choose alike).

use super::attention::{AttnGroup, AttnPlan};
use super::kernel_buffers::StepInputs;
use super::kernel_forward::KernelForward;

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
}
