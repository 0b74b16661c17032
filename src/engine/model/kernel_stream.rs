//! The kernel forward's layers as one streamed launch (`KernelOptions::layer_stream`): a pure
//! decode step of one row on one rank, with no adapter in the step and a cache in the compute
//! dtype, runs every dense layer through [`CudaKernels::decode_stream_into`] instead of five
//! launches a layer (the same buffers; the weights streamed into shared memory).
//!
//! [`CudaKernels::decode_stream_into`]: crate::engine::cuda::CudaKernels::decode_stream_into

use super::attention::{AttnGroup, AttnPlan};
use super::kernel_buffers::{Activations, StepInputs};
use super::kernel_forward::KernelForward;
use super::kv_cache::PagedKvCache;
use super::qwen3::Ffn;
use crate::engine::cuda::{LAYER_STREAM_MAX_LAYERS, StreamLayer, StreamStep};
use crate::error::Result;

impl KernelForward<'_> {
    /// Runs every layer of this step as one streamed launch when it can: the step is one
    /// decode row (no verify rows) and `whole` (no adapter, one rank, no trace), every layer
    /// dense with norms of one epsilon, the cache in the compute dtype. Returns whether it
    /// ran; the stream is then in `acts.residual[1]` with the last layer's down in
    /// `acts.down` still to add.
    pub(super) fn stream_layers(
        &self,
        (inputs, plan, acts): (&StepInputs, &AttnPlan, &Activations),
        cache: &PagedKvCache,
        whole: bool,
    ) -> Result<bool> {
        let (m, a) = (self.model, acts);
        let one_decode = !inputs.verify
            && matches!(
                plan.groups.as_slice(),
                [AttnGroup::KernelDecode { n: 1, first: 0 }]
            );
        let (Some(l0), Some(sync), Some((acc, ml))) =
            (m.layers.first(), &a.stream_sync, &a.scratch)
        else {
            return Ok(false);
        };
        let (at0, eps) = (&l0.attn, l0.input_norm.eps);
        let (hidden, inter) = (a.o.dim(1)?, a.act.dim(1)?);
        if !(whole
            && one_decode
            && cache.dtype() == m.dtype()
            && m.layers.len() <= LAYER_STREAM_MAX_LAYERS
            && self.kernels.layer_stream_serves(
                a.h.dim(0)?,
                (at0.num_heads, at0.num_kv_heads, at0.head_dim),
                (hidden, inter),
            ))
        {
            return Ok(false);
        }
        let mut layers = Vec::with_capacity(m.layers.len());
        for (li, layer) in m.layers.iter().enumerate() {
            let (at, n1, n2) = (&layer.attn, &layer.input_norm, &layer.post_norm);
            let Ffn::Dense(mlp) = &layer.ffn else {
                return Ok(false);
            };
            if n1.eps != eps || n2.eps != eps || at.q_norm.eps != at0.q_norm.eps {
                return Ok(false);
            }
            if mlp.intermediate != inter {
                return Ok(false);
            }
            let kv = cache.layer(li);
            layers.push(StreamLayer {
                weights: [
                    at.qkv.weight(),
                    at.o_proj.weight(),
                    mlp.gate_up.weight(),
                    mlp.down.weight(),
                ],
                norms: (&n1.weight, &n2.weight),
                qk_norms: (&at.q_norm.weight, &at.k_norm.weight),
                caches: (kv.k, kv.v),
            });
        }
        self.kernels.decode_stream_into(&StreamStep {
            layers,
            eps: (eps, at0.q_norm.eps),
            inv_freq: &m.inv_freq,
            residual: (&a.residual[0], &a.residual[1]),
            outs: [&a.qkv, &a.attn, &a.o, &a.act, &a.down],
            pos_slots: (&inputs.pos, &inputs.slots),
            tables: (&inputs.tables, &inputs.ctx_lens, cache.block_size()),
            scratch: (acc, ml, inputs.splits.max(1)),
            sync: (sync, &a.counters),
        })?;
        Ok(true)
    }
}
