//! The LoRA side of the kernel forward: a step with a row on an adapter runs each layer's
//! norms and matmuls unfused (the normed input must exist for the delta) and adds each fused
//! matmul's LoRA delta on the kernels (`kernels/lora.cu`) before the output is used; with
//! `KernelOptions::lora_fused`, steps of one-token tiles instead fold the deltas into the
//! norms and the SiLU ([`KernelForward::layers_lora_fused`]).
//!
//! Invariant: a step without a row on an adapter never comes here (its launches are those
//! of an engine without adapters, graphs included).

use candle_core::Tensor;

use super::attention::AttnPlan;
use super::blocks::Norm;
use super::kernel_forward::{Activations, KernelForward, StepInputs};
use super::kv_cache::PagedKvCache;
use super::lora_slots::LoraSlots;
use super::qwen3::Ffn;
use crate::engine::cuda::{LORA_FUSED_MAX_HIDDEN, LORA_FUSED_MAX_RANK, LORA_SILU_COLS};
use crate::error::Result;

/// What a step's LoRA deltas need: the slots, the step's tiles and the shrinks' scratch.
pub(crate) struct LoraStep<'a> {
    slots: &'a LoraSlots,
    tiles: Tensor,
    /// Tokens per tile (`crate::engine::cuda::lora_tile` of the step's tokens).
    tile: usize,
    /// The shrink's y of the qkv and gate|up matmuls (`[t, 3 * rank]`, f32; every matmul's
    /// on the two-launch path).
    y: Tensor,
    /// The fused path's: o's y (`[t, rank]`) and down's partial sums (`[t, parts, rank]`,
    /// a part per [`LORA_SILU_COLS`] columns of the SiLU product).
    y_o: Tensor,
    y_down: (Tensor, usize),
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
        let (r, n) = (slots.rank(), acts.act.dim(1)?);
        let parts = n.div_ceil(LORA_SILU_COLS);
        let flat = y.flatten_all()?;
        if flat.elem_count() < t * (4 + parts) * r {
            return Err(crate::engine::cuda::kernel_err("lora", "LoRA scratch too small"));
        }
        Ok(Some(LoraStep {
            slots,
            tiles: tiles.clone(),
            tile: crate::engine::cuda::lora_tile(t),
            y: flat.narrow(0, 0, t * 3 * r)?,
            y_o: flat.narrow(0, t * 3 * r, t * r)?,
            y_down: (flat.narrow(0, t * 4 * r, t * parts * r)?, parts),
        }))
    }

    /// Whether step `l` takes the fused LoRA decode path (`KernelOptions::lora_fused`):
    /// one-token tiles, dense layers, a rank and hidden size its kernels take.
    pub(crate) fn lora_fuses(&self, l: &LoraStep<'_>) -> Result<bool> {
        let m = self.model;
        let hidden = m.embed.dim(1)?;
        Ok(self.kernels.lora_fused()
            && l.tile == 1
            && l.slots.rank() <= LORA_FUSED_MAX_RANK
            && hidden <= LORA_FUSED_MAX_HIDDEN
            && m.layers.iter().all(|layer| layer.ffn.dense().is_some()))
    }

    /// Every layer and the final norm of a LoRA step on the fused path (the embedding
    /// already written into `acts.residual[0]`): per layer the norm + shrink (with the
    /// previous down's expand), qkv, its expand, the attention, o, its shrink, the norm +
    /// shrink (with o's expand), gate|up, the SiLU + expand + down's shrink, down.
    pub(crate) fn layers_lora_fused(
        &self,
        l: &LoraStep<'_>,
        (inputs, acts, plan, cache): (&StepInputs, &Activations, &AttnPlan, &PagedKvCache),
        attn: (bool, usize),
    ) -> Result<()> {
        let (m, k, a) = (self.model, self.kernels, acts);
        let tiles = &l.tiles;
        let (yd, parts) = (&l.y_down.0, l.y_down.1);
        let mut cur = 0;
        let mut delta: Option<&Tensor> = None;
        for (li, layer) in m.layers.iter().enumerate() {
            let (at, sg) = (&layer.attn, &l.slots.layers[li]);
            let Ffn::Dense(mlp) = &layer.ffn else {
                return Err(crate::engine::cuda::kernel_err("lora", "a sparse layer"));
            };
            let norm = &layer.input_norm;
            let down_before = li
                .checked_sub(1)
                .filter(|_| delta.is_some())
                .map(|p| (yd, parts, &l.slots.layers[p][3].b));
            k.lora_norm_shrink_into(
                (&a.residual[cur], delta, &a.residual[1 - cur]),
                (&norm.weight, norm.eps),
                down_before,
                &a.h,
                Some((&sg[0].a, &l.y)),
                tiles,
            )?;
            if delta.is_some() {
                cur = 1 - cur;
            }
            k.linear_next_into(&a.h, at.qkv.weight(), &a.qkv, Some(at.o_proj.weight()))?;
            k.lora_expand_into(&l.y, (&sg[0].b, &sg[0].splits), (tiles, 1), &a.qkv)?;
            let out = self.layer_attention(li, (inputs, acts, plan, cache), attn)?;
            let gu_w = mlp.gate_up.weight();
            k.linear_next_into(&out, at.o_proj.weight(), &a.o, Some(gu_w))?;
            k.lora_shrink_into(&out, &sg[1].a, (tiles, 1), &l.y_o)?;
            let norm = &layer.post_norm;
            k.lora_norm_shrink_into(
                (&a.residual[cur], Some(&a.o), &a.residual[1 - cur]),
                (&norm.weight, norm.eps),
                Some((&l.y_o, 1, &sg[1].b)),
                &a.h,
                Some((&sg[2].a, &l.y)),
                tiles,
            )?;
            cur = 1 - cur;
            k.linear_next_into(&a.h, gu_w, &a.gu, Some(mlp.down.weight()))?;
            k.lora_silu_shrink_into(&a.gu, (&l.y, &sg[2].b), &a.act, (&sg[3].a, yd), tiles)?;
            let next = m.layers.get(li + 1).map(|l| l.attn.qkv.weight());
            k.linear_next_into(&a.act, mlp.down.weight(), &a.down, next)?;
            delta = Some(&a.down);
        }
        let last = l.slots.layers.len().checked_sub(1);
        let down_before = last
            .filter(|_| delta.is_some())
            .map(|p| (yd, parts, &l.slots.layers[p][3].b));
        k.lora_norm_shrink_into(
            (&a.residual[cur], delta, &a.residual[1 - cur]),
            (&m.norm.weight, m.norm.eps),
            down_before,
            &a.h,
            None,
            tiles,
        )
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
