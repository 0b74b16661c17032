//! The kernel forward's layers as one streamed launch each (`KernelOptions::layer_stream`):
//! a pure decode step of one row on one rank, with no adapter in the step and a cache in the
//! compute dtype, runs each dense layer through [`CudaKernels::decode_stream_into`] instead
//! of its five launches (the same buffers; the weights streamed into shared memory).
//!
//! [`CudaKernels::decode_stream_into`]: crate::engine::cuda::CudaKernels::decode_stream_into

use candle_core::Tensor;

use super::attention::{AttnGroup, AttnPlan};
use super::kernel_buffers::{Activations, StepInputs};
use super::kernel_forward::KernelForward;
use super::kv_cache::PagedKvCache;
use super::qwen3::Ffn;
use crate::engine::cuda::StreamLayer;
use crate::error::Result;

impl KernelForward<'_> {
    /// Whether this step's dense layers run as one streamed launch each: the step is one
    /// decode row (no verify rows) and `whole` (no adapter, one rank, no trace).
    pub(super) fn stream_step(
        &self,
        (inputs, plan, acts): (&StepInputs, &AttnPlan, &Activations),
        cache: &PagedKvCache,
        t: usize,
        whole: bool,
    ) -> Result<bool> {
        let one_decode = !inputs.verify
            && matches!(
                plan.groups.as_slice(),
                [AttnGroup::KernelDecode { n: 1, first: 0 }]
            );
        let Some(l0) = self.model.layers.first() else {
            return Ok(false);
        };
        let at = &l0.attn;
        let hidden = acts.o.dim(1)?;
        let inter = acts.act.dim(1)?;
        Ok(whole
            && one_decode
            && acts.stream_sync.is_some()
            && acts.scratch.is_some()
            && cache.dtype() == self.model.dtype()
            && self.kernels.layer_stream_serves(
                t,
                (at.num_heads, at.num_kv_heads, at.head_dim),
                (hidden, inter),
            ))
    }

    /// Layer `li` as one launch, when it is dense (its norms of one epsilon): reads the
    /// stream in `acts.residual[cur]` (plus `delta`, the layer before's down), leaves it in
    /// the returned buffer index and the layer's down in `acts.down`; None for a layer it
    /// does not take (the caller runs the five launches).
    pub(super) fn stream_launch(
        &self,
        li: usize,
        (inputs, acts, cache): (&StepInputs, &Activations, &PagedKvCache),
        cur: usize,
        delta: Option<&Tensor>,
    ) -> Result<Option<usize>> {
        let (m, a) = (self.model, acts);
        let layer = &m.layers[li];
        let (Ffn::Dense(mlp), Some(sync), Some((acc, ml))) =
            (&layer.ffn, &a.stream_sync, &a.scratch)
        else {
            return Ok(None);
        };
        let (at, n1, n2) = (&layer.attn, &layer.input_norm, &layer.post_norm);
        if n1.eps != n2.eps || mlp.intermediate != a.act.dim(1)? {
            return Ok(None);
        }
        let kv = cache.layer(li);
        // With a delta the stream moves twice (back to `cur`), else once.
        let next = if delta.is_some() { cur } else { 1 - cur };
        let l = StreamLayer {
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
            tables: (&inputs.tables, &inputs.ctx_lens, cache.block_size()),
            scratch: (acc, ml, inputs.splits.max(1)),
            sync: (sync, &a.counters),
        };
        self.kernels.decode_stream_into(&l)?;
        Ok(Some(next))
    }
}
