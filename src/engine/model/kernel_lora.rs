//! The LoRA side of the kernel forward: a step with a row on an adapter runs each layer's
//! norms and matmuls unfused (the normed input must exist for the delta) and adds each fused
//! matmul's LoRA delta on the kernels (`kernels/lora.cu`) before the output is used.
//!
//! Invariant: a step without a row on an adapter never comes here (its launches are those
//! of an engine without adapters, graphs included).

use candle_core::Tensor;

use super::blocks::Norm;
use super::kernel_forward::{Activations, KernelForward, StepInputs};
use super::lora_slots::LoraSlots;
use crate::error::Result;

/// What a step's LoRA deltas need: the slots, the step's tiles and the shrink's scratch.
pub(crate) struct LoraStep<'a> {
    slots: &'a LoraSlots,
    tiles: Tensor,
    /// Tokens per tile (`crate::engine::cuda::lora_tile` of the step's tokens).
    tile: usize,
    y: Tensor,
}

impl<'m> KernelForward<'m> {
    /// The step's LoRA inputs, when a row of it runs on an adapter (the scratch is the
    /// activations' own, allocated with them on a model with slots, so a captured step
    /// allocates nothing).
    pub(crate) fn lora_step(
        &self,
        inputs: &StepInputs,
        acts: &Activations,
    ) -> Result<Option<LoraStep<'m>>> {
        let (Some(slots), Some(tiles)) = (self.model.lora.as_ref(), inputs.lora.as_ref()) else {
            return Ok(None);
        };
        let t = acts.h.dim(0)?;
        let y = acts.lora_y.clone().ok_or_else(|| {
            crate::engine::cuda::kernel_err("lora", "activations without the LoRA scratch")
        })?;
        Ok(Some(LoraStep {
            slots,
            tiles: tiles.clone(),
            tile: crate::engine::cuda::lora_tile(t),
            y,
        }))
    }

    /// `out += delta` of fused matmul `g` of layer `li` for input `x`.
    pub(crate) fn lora_add(
        &self,
        x: &Tensor,
        out: &Tensor,
        (l, li, g): (&LoraStep<'_>, usize, usize),
    ) -> Result<()> {
        let sg = &l.slots.layers[li][g];
        self.kernels
            .lora_into(x, (&sg.a, &sg.b, &sg.splits), (&l.tiles, l.tile), &l.y, out)
    }

    /// `h = rmsnorm(res + delta)`, `out = h · wᵀ + LoRA delta`, then with `silu`
    /// (`Some((gu, act))`, `out` being `gu`) the SiLU product into `act`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn norm_linear_lora(
        &self,
        (res, delta, res_out): (&Tensor, Option<&Tensor>, &Tensor),
        norm: &Norm,
        h: &Tensor,
        w: &Tensor,
        out: &Tensor,
        silu: Option<(&Tensor, &Tensor)>,
        lora: (&LoraStep<'_>, usize, usize),
    ) -> Result<()> {
        let k = self.kernels;
        k.add_rmsnorm_to(delta, res, res_out, &norm.weight, norm.eps, h)?;
        k.linear_into(h, w, out)?;
        self.lora_add(h, out, lora)?;
        if let Some((gu, act)) = silu {
            k.silu_mul_into(gu, act)?;
        }
        Ok(())
    }
}
