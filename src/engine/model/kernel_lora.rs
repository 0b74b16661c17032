//! The LoRA side of the kernel forward: a step with a row on an adapter runs each layer's
//! norms and matmuls unfused (the normed input must exist for the delta) and adds each fused
//! matmul's LoRA delta on the kernels (`kernels/lora.cu`) before the output is used.
//!
//! With `KernelOptions::lora_overlap`, steps of up to 64 rows (one-token tiles) shrink before
//! the base matmul instead of after it ([`KernelForward::lora_shrink`]; above
//! `KernelOptions::lora_side_min_rows` rows (none by default) on a second stream beside it),
//! expand the gate|up delta in the SiLU's launch, and defer the o and down expands into the
//! add+RMSNorm that follows them
//! ([`KernelForward::lora_norm_into`]): four LoRA launches a layer instead of eight plus the
//! SiLU, with the same rounding (the logits equal the serial path's bit for bit).
//!
//! With `KernelOptions::lora_wide` (slots stored after the base weights,
//! `lora_slots::LoraSlots::is_wide`) the overlap's steps of 3-64 rows (by default) shrink
//! inside the base matmuls: each matmul writes the step's `wide` output (base columns, then
//! every slot's `y`), and the same fused expands read it (`engine::cuda::lora_wide`): no
//! shrink launch, no second stream.
//!
//! With `KernelOptions::lora_grouped`, steps of 33-64 rows take the grouped shrink where it
//! measured faster (`CudaKernels::lora_shrink_into` chooses it; the tiles come sorted by
//! slot), on either path; the grouped expand only where the kernels are told to use them
//! everywhere (profiling), and then the overlap's gate|up delta takes it and the SiLU apart.
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
    /// The overlap's path (one-token tiles, `KernelOptions::lora_overlap`, one rank, dense
    /// layers, no trace).
    overlap: bool,
    /// Its shrinks on the second stream.
    side: bool,
    /// The grouped expand serves the step (`KernelOptions::lora_grouped`, 33-64 rows, and
    /// `CudaKernels::set_lora_grouped_everywhere`): the overlap's gate|up delta then takes the
    /// grouped expand and the SiLU apart, not the fused one-token expand+SiLU.
    grouped: bool,
    /// The wide matmuls' outputs (qkv, o, gate|up, down), when the step takes them.
    wide: Option<[Tensor; 4]>,
}

/// The fused matmul whose expand an add+RMSNorm takes over on the overlap's path: layer and
/// group (1: o, 3: down).
pub(crate) type Deferred = Option<(usize, usize)>;

impl<'m> KernelForward<'m> {
    /// The step's LoRA inputs, when a row of it runs on an adapter (the scratch is the
    /// activations' own, allocated with them on a model with slots, so a captured step
    /// allocates nothing); `one_rank`: no tensor parallelism (the overlap needs it).
    pub(crate) fn lora_step(
        &self,
        inputs: &StepInputs,
        acts: &Activations,
        one_rank: bool,
    ) -> Result<Option<LoraStep<'m>>> {
        let (Some(slots), Some(tiles)) = (self.model.lora.as_ref(), inputs.lora.as_ref()) else {
            return Ok(None);
        };
        let t = acts.h.dim(0)?;
        let y = acts.lora_y.clone().ok_or_else(|| {
            crate::engine::cuda::kernel_err("lora", "activations without the LoRA scratch")
        })?;
        let tile = crate::engine::cuda::lora_tile(t);
        let overlap = one_rank
            && tile == 1
            && self.model.layers.iter().all(|l| l.ffn.dense().is_some())
            && self.kernels.lora_overlap()
            && slots.rank() <= crate::engine::cuda::LORA_OVERLAP_MAX_RANK;
        let wide = acts
            .lora_wide
            .clone()
            .filter(|_| overlap && slots.is_wide() && self.kernels.lora_wide_serves(t));
        let grouped =
            wide.is_none() && self.kernels.lora_grouped_expands(t, tiles.elem_count() / 3);
        Ok(Some(LoraStep {
            slots,
            tiles: tiles.clone(),
            tile,
            y,
            overlap,
            side: overlap && wide.is_none() && self.kernels.lora_side(t),
            grouped,
            wide,
        }))
    }

    /// On the overlap's path, the shrink of fused matmul `g` of layer `li` for input `x`,
    /// queued before the base matmul on `x` (on the second stream above
    /// `KernelOptions::lora_side_min_rows` rows); nothing otherwise.
    pub(crate) fn lora_shrink(
        &self,
        x: &Tensor,
        (l, li, g): (&LoraStep<'_>, usize, usize),
    ) -> Result<()> {
        if !l.overlap || l.wide.is_some() {
            return Ok(());
        }
        let (k, sg) = (self.kernels, &l.slots.layers[li][g]);
        let tiles = (&l.tiles, l.tile);
        if l.side {
            k.lora_shrink_beside(x, &sg.a, tiles, &l.y)
        } else {
            k.lora_shrink_into(x, &sg.a, tiles, &l.y)
        }
    }

    /// `out += delta` of fused matmul `g` of layer `li` for input `x`. On the overlap's path
    /// the shrink ([`KernelForward::lora_shrink`]) is queued already: the qkv delta is
    /// expanded here, the o and down deltas by the add+RMSNorm after them.
    pub(crate) fn lora_add(
        &self,
        x: &Tensor,
        out: &Tensor,
        (l, li, g): (&LoraStep<'_>, usize, usize),
    ) -> Result<()> {
        let (k, sg) = (self.kernels, &l.slots.layers[li][g]);
        let tiles = (&l.tiles, l.tile);
        if l.overlap {
            if g == 1 || g == 3 {
                return Ok(());
            }
            self.lora_join(l)?;
            return k.lora_expand_into(&l.y, (&sg.b, &sg.splits), tiles, out);
        }
        k.lora_into(x, (&sg.a, &sg.b, &sg.splits), tiles, &l.y, out)
    }

    /// `out = x · wᵀ` (prefetching `next` as `CudaKernels::linear_next_into` does) plus
    /// fused matmul `g`'s LoRA delta when the step has one: the overlap's shrink before it,
    /// the delta after it (or deferred to the add+RMSNorm); on the wide path the one matmul
    /// into the step's wide output of `g`, whose consumers add the delta.
    pub(crate) fn linear_lora(
        &self,
        (x, w, out): (&Tensor, &Tensor, &Tensor),
        next: Option<&Tensor>,
        lora: Option<(&LoraStep<'_>, usize, usize)>,
    ) -> Result<()> {
        let k = self.kernels;
        let Some((l, li, g)) = lora else {
            return k.linear_next_into(x, w, out, next);
        };
        if let Some(wide) = &l.wide {
            return k.linear_into(x, wide_weight(l, li, g)?, &wide[g]);
        }
        self.lora_shrink(x, (l, li, g))?;
        k.linear_next_into(x, w, out, next)?;
        self.lora_add(x, out, (l, li, g))
    }

    /// The kernels' stream waits for the shrink on the second stream (when one is there).
    fn lora_join(&self, l: &LoraStep<'_>) -> Result<()> {
        if l.side {
            self.kernels.lora_join()?;
        }
        Ok(())
    }

    /// The add+RMSNorm `h = rmsnorm(res + delta)` (`res_out` the sum), with `before`'s delta
    /// expanded into `delta` first on the overlap's path.
    pub(crate) fn lora_norm_into(
        &self,
        (res, delta, res_out): (&Tensor, Option<&Tensor>, &Tensor),
        norm: &Norm,
        h: &Tensor,
        (l, before): (&LoraStep<'_>, Deferred),
    ) -> Result<()> {
        let k = self.kernels;
        match (delta, before, &l.wide) {
            // The wide path: the delta and its shrink are the matmul's wide output.
            (Some(_), Some((li, g)), Some(wide)) => {
                let b = &l.slots.layers[li][g].b;
                let nw = (&norm.weight, norm.eps);
                k.lora_add_rmsnorm_wide_into((&wide[g], res, res_out), nw, h, b, &l.tiles)
            }
            (Some(d), Some((li, g)), None) if l.overlap => {
                self.lora_join(l)?;
                let b = &l.slots.layers[li][g].b;
                let nw = (&norm.weight, norm.eps);
                k.lora_add_rmsnorm_into((d, res, res_out), nw, h, (&l.y, b), &l.tiles)
            }
            _ => k.add_rmsnorm_to(delta, res, res_out, &norm.weight, norm.eps, h),
        }
    }

    /// `h = rmsnorm(res + delta)` (with `before`'s deferred expand), `out = h · wᵀ + LoRA
    /// delta`, then with `silu` (`Some((gu, act))`, `out` being `gu`) the SiLU product into
    /// `act`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn norm_linear_lora(
        &self,
        res: (&Tensor, Option<&Tensor>, &Tensor),
        norm: &Norm,
        h: &Tensor,
        w: &Tensor,
        out: &Tensor,
        silu: Option<(&Tensor, &Tensor)>,
        (lora, before): ((&LoraStep<'_>, usize, usize), Deferred),
    ) -> Result<()> {
        let k = self.kernels;
        let (l, li, g) = lora;
        self.lora_norm_into(res, norm, h, (l, before))?;
        if let Some(wide) = &l.wide {
            let sg = &l.slots.layers[li][g];
            k.linear_into(h, wide_weight(l, li, g)?, &wide[g])?;
            return match silu {
                Some((_, act)) => k.lora_expand_silu_wide_into(&wide[g], &sg.b, act, &l.tiles),
                None => k.lora_wide_expand_into(&wide[g], (&sg.b, &sg.splits), out, &l.tiles),
            };
        }
        self.lora_shrink(h, lora)?;
        k.linear_into(h, w, out)?;
        match silu {
            Some((gu, act)) if l.overlap && !l.grouped => {
                self.lora_join(l)?;
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

/// Fused matmul `g` of layer `li` with its slots' `a` after the base rows (the wide layout).
fn wide_weight<'a>(l: &'a LoraStep<'_>, li: usize, g: usize) -> Result<&'a Tensor> {
    l.slots.layers[li][g]
        .wide
        .as_ref()
        .ok_or_else(|| crate::engine::cuda::kernel_err("lora", "slots without the wide layout"))
}
