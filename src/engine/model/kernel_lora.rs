//! The LoRA side of the kernel forward: a step with a row on an adapter runs each layer's
//! norms and matmuls unfused (the normed input must exist for the delta) and adds each fused
//! matmul's LoRA delta on the kernels (`kernels/lora.cu`) before the output is used. With
//! `KernelOptions::lora_overlap`, steps of one-token tiles queue each shrink on a second
//! stream before the base matmul that reads the same input ([`KernelForward::lora_shrink`])
//! and join it before the expand ([`KernelForward::lora_add`]); the gate|up expand is then one
//! launch with the SiLU.
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
    /// The shrinks run beside the base matmuls (one-token tiles, `KernelOptions::lora_overlap`).
    overlap: bool,
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
        let tile = crate::engine::cuda::lora_tile(t);
        let overlap = tile == 1
            && self.kernels.lora_overlap()
            && slots.rank() <= crate::engine::cuda::LORA_OVERLAP_MAX_RANK;
        Ok(Some(LoraStep {
            slots,
            tiles: tiles.clone(),
            tile,
            y,
            overlap,
        }))
    }

    /// With the overlap, queues the shrink of fused matmul `g` of layer `li` for input `x` on
    /// the second stream (before the base matmul on `x`); nothing otherwise.
    pub(crate) fn lora_shrink(
        &self,
        x: &Tensor,
        (l, li, g): (&LoraStep<'_>, usize, usize),
    ) -> Result<()> {
        if !l.overlap {
            return Ok(());
        }
        let sg = &l.slots.layers[li][g];
        self.kernels
            .lora_shrink_beside(x, &sg.a, (&l.tiles, l.tile), &l.y)
    }

    /// `out += delta` of fused matmul `g` of layer `li` for input `x` (with the overlap: the
    /// join and the expand of the shrink [`KernelForward::lora_shrink`] queued).
    pub(crate) fn lora_add(
        &self,
        x: &Tensor,
        out: &Tensor,
        (l, li, g): (&LoraStep<'_>, usize, usize),
    ) -> Result<()> {
        let (k, sg) = (self.kernels, &l.slots.layers[li][g]);
        let tiles = (&l.tiles, l.tile);
        if l.overlap {
            k.lora_join()?;
            return k.lora_expand_into(&l.y, (&sg.b, &sg.splits), tiles, out);
        }
        k.lora_into(x, (&sg.a, &sg.b, &sg.splits), tiles, &l.y, out)
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
        self.lora_shrink(h, lora)?;
        k.linear_into(h, w, out)?;
        let (l, li, g) = lora;
        match silu {
            Some((gu, act)) if l.overlap => {
                k.lora_join()?;
                let sg = &l.slots.layers[li][g];
                k.lora_expand_silu_into(gu, (&l.y, &sg.b), act, &l.tiles)
            }
            Some((gu, act)) => {
                self.lora_add(h, out, lora)?;
                k.silu_mul_into(gu, act)
            }
            None => self.lora_add(h, out, lora),
        }
    }
}
