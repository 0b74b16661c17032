//! One layer's attention on the engine's kernels (`KernelForward::attend_kernels`): the
//! decode and prefill groups of a step on the paged kernels, the rest through the gather path.

use candle_core::Tensor;

use super::attention::{AttnGroup, AttnPlan, attend_group};
use super::kernel_buffers::{Activations, StepInputs};
use super::kernel_forward::KernelForward;
use crate::engine::cuda::CudaKernels;
use crate::engine::kv_format::KvRef;
use crate::error::Result;

impl KernelForward<'_> {
    /// One layer's attention on the kernels: every group writes its rows of one `[T, nh * hd]`
    /// output (decode runs through the decode kernel, all prefill chunks through one prefill
    /// launch); groups the kernels do not serve go through the gather path.
    pub(super) fn attend_kernels(
        &self,
        kv: KvRef<'_>,
        plan: &AttnPlan,
        inputs: &StepInputs,
        acts: &Activations,
        bs: usize,
    ) -> Result<Tensor> {
        let (m, k) = (self.model, self.kernels);
        let (q, out) = (&acts.q, &acts.attn);
        let (tiles, meta, ptables) = &inputs.prefill;
        let (_, nh, hd) = q.dims3()?;
        let nd = inputs.ctx_lens.elem_count();
        let part = CudaKernels::decode_partition(nd);
        // The rows `first..first + n` of the decode tables (all of them for a graph, whose
        // width only the device knows).
        let rows_of = |first: usize, n: usize| -> Result<(Tensor, Tensor)> {
            let ctx = inputs.ctx_lens.narrow(0, first, n)?;
            if first == 0 && n == nd {
                return Ok((inputs.tables.clone(), ctx));
            }
            let w = inputs.tables.elem_count() / nd.max(1);
            Ok((inputs.tables.narrow(0, first * w, n * w)?, ctx))
        };
        let all_kernel = plan.groups.iter().all(|g| {
            matches!(
                g,
                AttnGroup::KernelDecode { .. } | AttnGroup::KernelPrefill { .. }
            )
        });
        if all_kernel {
            let mut t0 = 0;
            let mut prefill = false;
            for g in &plan.groups {
                let n = g.tokens();
                match g {
                    AttnGroup::KernelDecode { n, first } => {
                        let (tables, ctx) = rows_of(*first, *n)?;
                        let (q, out) = (&q.narrow(0, t0, *n)?, &out.narrow(0, t0, *n)?);
                        let tables = (&tables, inputs.width.as_ref());
                        let splits = (inputs.splits, part, acts.scratch.as_ref());
                        match inputs.runs.as_ref().filter(|_| inputs.verify) {
                            Some(runs) => {
                                let runs = runs.narrow(0, *first, *n)?;
                                k.paged_verify_into(q, kv, tables, &ctx, &runs, bs, out, splits)?
                            }
                            None => k.paged_decode_into(q, kv, tables, &ctx, bs, out, splits)?,
                        }
                    }
                    _ => prefill = true,
                }
                t0 += n;
            }
            if prefill {
                let keys = inputs.prefill_keys;
                k.paged_prefill_into(q, kv, tiles, meta, ptables, bs, keys, out)?;
            }
            return Ok(out.clone());
        }
        let a = &m.layers[0].attn;
        let mut outs = Vec::with_capacity(plan.groups.len());
        let mut t0 = 0;
        for g in &plan.groups {
            let n = g.tokens();
            let qg = q.narrow(0, t0, n)?;
            outs.push(match g {
                AttnGroup::KernelDecode { n, first } => {
                    let (tables, ctx) = rows_of(*first, *n)?;
                    let w = tables.elem_count() / n;
                    k.paged_decode(&qg, kv, &tables.reshape((*n, w))?, &ctx, bs)?
                }
                other => attend_group(&qg, kv, t0, other, nh, a.num_kv_heads, hd)?,
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
