//! The kernel forward's layers as one launch each (`KernelOptions::layer_kernel`): a pure
//! decode step of 1-2 rows on one rank, with no adapter in the step and a cache in the
//! compute dtype, runs each dense layer through [`CudaKernels::decode_layer_into`] instead of
//! its five launches (the same buffers, the same sums in the same order).

use candle_core::Tensor;

use super::kernel_forward::{Activations, KernelForward, StepInputs};
use super::kv_cache::PagedKvCache;
use super::qwen3::Ffn;
use crate::engine::cuda::DecodeLayer;
use crate::error::Result;

impl KernelForward<'_> {
    /// Whether this step's dense layers run as one launch each (the step is pure decode and
    /// fused, `whole`: no adapter, one rank, no trace).
    pub(super) fn layer_kernel_step(
        &self,
        acts: &Activations,
        cache: &PagedKvCache,
        t: usize,
        whole: bool,
    ) -> bool {
        let Some(l0) = self.model.layers.first() else {
            return false;
        };
        let at = &l0.attn;
        whole
            && acts.layer_bar.is_some()
            && acts.scratch.is_some()
            && cache.dtype() == self.model.dtype()
            && self
                .kernels
                .layer_kernel_serves(t, at.num_heads, at.num_kv_heads, at.head_dim)
    }

    /// Layer `li` as one launch, when it is dense (its norms of one epsilon): reads the
    /// stream in `acts.residual[cur]` (plus `delta`, the layer before's down), leaves it in
    /// the returned buffer index and the layer's down in `acts.down`; None for a layer it
    /// does not take (the caller runs the five launches).
    pub(super) fn layer_launch(
        &self,
        li: usize,
        (inputs, acts, cache): (&StepInputs, &Activations, &PagedKvCache),
        cur: usize,
        delta: Option<&Tensor>,
    ) -> Result<Option<usize>> {
        let (m, a) = (self.model, acts);
        let layer = &m.layers[li];
        let (Ffn::Dense(mlp), Some(bar), Some((acc, ml))) = (&layer.ffn, &a.layer_bar, &a.scratch)
        else {
            return Ok(None);
        };
        let (at, n1, n2) = (&layer.attn, &layer.input_norm, &layer.post_norm);
        if n1.eps != n2.eps {
            return Ok(None);
        }
        let kv = cache.layer(li);
        // With a delta the stream moves twice (back to `cur`), else once.
        let next = if delta.is_some() { cur } else { 1 - cur };
        let l = DecodeLayer {
            weights: [
                at.qkv.weight(),
                at.o_proj.weight(),
                mlp.gate_up.weight(),
                mlp.down.weight(),
            ],
            norms: (&n1.weight, &n2.weight, n1.eps),
            qk_norms: (&at.q_norm.weight, &at.k_norm.weight, at.q_norm.eps),
            inv_freq: &m.inv_freq,
            residual: (
                &a.residual[cur],
                delta,
                &a.residual[1 - cur],
                &a.residual[next],
            ),
            outs: [&a.qkv, &a.attn, &a.o, &a.act, &a.down],
            pos_slots: (&inputs.pos, &inputs.slots),
            caches: (kv.k, kv.v),
            tables: (
                &inputs.tables,
                inputs.width.as_ref(),
                &inputs.ctx_lens,
                cache.block_size(),
            ),
            scratch: (acc, ml, inputs.splits.max(1)),
            barrier: bar,
        };
        self.kernels.decode_layer_into(&l)?;
        Ok(Some(next))
    }
}
