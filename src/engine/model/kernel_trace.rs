//! [`KernelForward::trace`]: one step of the kernel forward with every layer's intermediate
//! states copied out, for accuracy work against a reference (`kernel_check --trace-ids`,
//! `scripts/hf_trace_check.py`). Never used by serving.

use candle_core::Tensor;

use super::kernel_forward::KernelForward;
use super::kv_cache::PagedKvCache;
use crate::engine::batch::SeqInput;
use crate::error::Result;

impl KernelForward<'_> {
    /// The forward of one rank-0 step with every layer's intermediate states, for accuracy
    /// work against a reference (`kernel_check --trace`): per layer `attn.L` (the o
    /// projection's output), `mlp.L` (the down projection's output) and `resid.L` (the
    /// residual stream after the layer, in f32), then `norm` (the final norm's output) and
    /// `logits`. Allocates a copy of each; never used by serving.
    pub fn trace(
        &self,
        tokens: &[u32],
        seqs: &[SeqInput<'_>],
        cache: &PagedKvCache,
    ) -> Result<Vec<(String, Tensor)>> {
        let (inputs, plan, acts) = self.prepare(tokens, seqs, cache)?;
        let mut states = Vec::new();
        self.layers_into(&inputs, &acts, &plan, cache, None, Some(&mut states))?;
        states.push(("norm".into(), acts.h.copy()?));
        if let Some(l) = self.logits(seqs, acts.h)? {
            states.push(("logits".into(), l));
        }
        Ok(states)
    }

    /// Records layer `li`'s attention output, MLP output and residual into `trace` (when
    /// tracing).
    pub(super) fn trace_layer(
        &self,
        trace: Option<&mut Vec<(String, Tensor)>>,
        li: usize,
        o: &Tensor,
        residual: &Tensor,
        down: &Tensor,
    ) -> Result<()> {
        if let Some(tr) = trace {
            let f32 = |x: &Tensor| x.to_dtype(candle_core::DType::F32);
            tr.push((format!("attn.{li}"), o.copy()?));
            tr.push((format!("mlp.{li}"), down.copy()?));
            tr.push((format!("resid.{li}"), (f32(residual)? + f32(down)?)?));
        }
        Ok(())
    }
}
