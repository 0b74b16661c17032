//! The adapters resident on the device: [`LoraSlots`], `max_loras` slots of stacked LoRA
//! weights per decoder layer and fused matmul (qkv, o, gate|up, down), and the candle-op
//! delta a forward adds to each fused matmul's output.
//!
//! Layout, per layer and group of `P` projections with `out` output rows in all: `a` is
//! `[slots, P * R, in]` (projection `p`'s `lora_A` in rows `p*R .. p*R + rank`, zeros
//! after), `b` is `[slots, out, R]` (projection `p`'s rows of the fused output hold its
//! scaled `lora_B` in columns `0..rank`, zeros after), `R` the engine's `max_lora_rank`. So
//! for a token `x` on slot `s`: `y = a[s] x` (`[P * R]`), and output row `o` of projection
//! `p` gains `b[s, o] · y[p*R .. (p+1)*R]` — the same for the kernels and the candle ops.
//!
//! With the wide layout (`Model::widen_lora_slots`, `KernelOptions::lora_wide`) each group's `a`
//! lives in the same device buffer as the layer's fused weight, after its rows
//! (`[out + slots * P * R, in]`, [`SlotGroup::wide`]): one matmul of a step's rows against the
//! whole buffer gives the base output and every slot's `y`. The layer's weight is a view of the
//! buffer's first `out` rows, so the base path and in-place weight updates see it unchanged.
//!
//! Invariant: a slot's weights are written only while no step in flight reads that slot
//! (the scheduler's residency table guarantees it), and a zeroed slot adds nothing.

use candle_core::{DType, Device, Tensor};

use super::config::ModelConfig;
use super::lora::{LoraAdapter, LoraWeights, Proj};
use crate::error::{Error, Result};

/// The fused matmuls a LoRA delta is added to.
pub const GROUPS: usize = 4;

/// One layer's slots of one fused matmul.
#[derive(Debug)]
pub struct SlotGroup {
    /// `[slots, P * R, in]`.
    pub a: Tensor,
    /// `[slots, out, R]`.
    pub b: Tensor,
    /// The first output row of each projection, and `out` at the end (`P + 1` entries).
    pub splits: Vec<usize>,
    /// With the wide layout: the fused weight and `a` in one buffer, `[out + slots * P * R,
    /// in]` (the layer's weight and `a` are views of it).
    pub wide: Option<Tensor>,
}

/// The adapters' slots on the device.
#[derive(Debug)]
pub struct LoraSlots {
    slots: usize,
    rank: usize,
    /// Per layer, per group (qkv, o, gate|up, down).
    pub layers: Vec<[SlotGroup; GROUPS]>,
}

/// The projections of group `g`, in order.
pub fn group_projs(g: usize) -> &'static [Proj] {
    match g {
        0 => &[Proj::Q, Proj::K, Proj::V],
        1 => &[Proj::O],
        2 => &[Proj::Gate, Proj::Up],
        _ => &[Proj::Down],
    }
}

/// The input features of group `g` and the first output row of each of its projections,
/// with the group's output rows at the end (`P + 1` entries), in the model of `cfg`.
fn group_shape(cfg: &ModelConfig, g: usize) -> (usize, Vec<usize>) {
    let projs = group_projs(g);
    let mut splits = vec![0];
    for p in projs {
        splits.push(splits.last().copied().unwrap_or(0) + p.dims(cfg).1);
    }
    (projs[0].dims(cfg).0, splits)
}

/// One run of consecutive tokens of a batch on one slot (`None`: the base alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// First token (row of the batch).
    pub start: usize,
    /// Tokens.
    pub len: usize,
    /// The slot.
    pub slot: Option<u32>,
}

impl LoraSlots {
    /// `slots` empty (zero) slots of rank `rank` (padded to a multiple of 8, which the
    /// kernels read eight at a time) for a model of `cfg` in `dtype`.
    pub fn new(
        cfg: &ModelConfig,
        slots: usize,
        rank: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        if slots == 0 || rank == 0 {
            return Err(Error::InvalidInput(format!(
                "--max-loras ({slots}) and --max-lora-rank ({rank}) must be positive"
            )));
        }
        let rank = rank.div_ceil(8) * 8;
        let layers = (0..cfg.num_hidden_layers)
            .map(|_| {
                let group = |g: usize| -> Result<SlotGroup> {
                    let (fan_in, splits) = group_shape(cfg, g);
                    let (parts, out) = (splits.len() - 1, *splits.last().unwrap_or(&0));
                    Ok(SlotGroup {
                        a: Tensor::zeros((slots, parts * rank, fan_in), dtype, device)?,
                        b: Tensor::zeros((slots, out, rank), dtype, device)?,
                        splits,
                        wide: None,
                    })
                };
                Ok([group(0)?, group(1)?, group(2)?, group(3)?])
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            slots,
            rank,
            layers,
        })
    }

    /// Slots (adapters resident at once).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The rank every slot is padded to.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Whether `a` lives after the base weights (`Model::widen_lora_slots`).
    pub fn is_wide(&self) -> bool {
        self.layers.iter().flatten().all(|g| g.wide.is_some())
    }

    /// Device bytes the slots take.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|g| (g.a.elem_count() + g.b.elem_count()) * g.a.dtype().size_in_bytes())
            .sum()
    }

    /// Writes an adapter's image into `slot` (one upload per layer and group; the layout
    /// work was done when the image was built, off the scheduler's thread).
    pub fn load(&self, slot: usize, image: &SlotImage) -> Result<()> {
        if slot >= self.slots
            || image.slot_rank != self.rank
            || image.layers.len() != self.layers.len()
        {
            return Err(Error::Engine(format!(
                "an adapter image of rank {} over {} layers does not fit slot {slot} of {} (rank {}, {} layers)",
                image.slot_rank,
                image.layers.len(),
                self.slots,
                self.rank,
                self.layers.len()
            )));
        }
        for (groups, parts) in self.layers.iter().zip(&image.layers) {
            for (sg, (a, b)) in groups.iter().zip(parts) {
                let dev = sg.a.device();
                sg.a.slice_set(&a.to_device(dev)?, 0, slot)?;
                sg.b.slice_set(&b.to_device(dev)?, 0, slot)?;
            }
        }
        Ok(())
    }

    /// The LoRA delta of group `g` of layer `li` for the batch input `x` (`[T, in]`) whose
    /// rows `segs` assigns to slots, with candle ops: `[T, out]` in `x`'s dtype, or `None`
    /// when no segment has a slot.
    pub fn delta(
        &self,
        li: usize,
        g: usize,
        x: &Tensor,
        segs: &[Segment],
    ) -> Result<Option<Tensor>> {
        if segs.iter().all(|s| s.slot.is_none()) {
            return Ok(None);
        }
        let sg = &self.layers[li][g];
        let out = *sg.splits.last().unwrap_or(&0);
        let r = self.rank;
        let mut parts = Vec::with_capacity(segs.len());
        for s in segs {
            let Some(slot) = s.slot else {
                parts.push(Tensor::zeros((s.len, out), x.dtype(), x.device())?);
                continue;
            };
            let xs = x.narrow(0, s.start, s.len)?;
            let a = sg.a.get(slot as usize)?; // [P*R, in]
            let b = sg.b.get(slot as usize)?; // [out, R]
            let y = xs.matmul(&a.t()?)?; // [n, P*R]
            let mut outs = Vec::with_capacity(sg.splits.len() - 1);
            for p in 0..sg.splits.len() - 1 {
                // Contiguous: CUDA matmuls take no strided operand.
                let yp = y.narrow(1, p * r, r)?.contiguous()?;
                let bp = b.narrow(0, sg.splits[p], sg.splits[p + 1] - sg.splits[p])?;
                outs.push(yp.matmul(&bp.t()?)?);
            }
            parts.push(Tensor::cat(&outs, 1)?);
        }
        Ok(Some(Tensor::cat(&parts, 0)?))
    }
}

/// An adapter laid out as a slot holds it (padded to the slots' rank, in their dtype), in
/// host memory: built once when the adapter is loaded (on the caller's thread), written into a
/// device slot whenever the adapter moves in.
#[derive(Debug)]
pub struct SlotImage {
    /// Digest of the adapter's files.
    pub digest: String,
    /// The adapter's largest rank.
    pub rank: usize,
    /// The projections it targets.
    pub targets: Vec<&'static str>,
    /// The rank every part is padded to.
    slot_rank: usize,
    /// Per layer and group: `a` `[1, P * R, in]`, `b` `[1, out, R]`.
    layers: Vec<[(Tensor, Tensor); GROUPS]>,
}

impl SlotImage {
    /// `adapter` laid out for slots of rank `rank` (padded to a multiple of 8 as
    /// [`LoraSlots::new`] pads it) in `dtype`, for a model of `cfg`.
    pub fn new(
        adapter: &LoraAdapter,
        cfg: &ModelConfig,
        rank: usize,
        dtype: DType,
    ) -> Result<Self> {
        let r = rank.div_ceil(8) * 8;
        if adapter.rank > r || adapter.layers.len() != cfg.num_hidden_layers {
            return Err(Error::Engine(format!(
                "an adapter of rank {} over {} layers does not fit slots of rank {r} over {} layers",
                adapter.rank,
                adapter.layers.len(),
                cfg.num_hidden_layers
            )));
        }
        let group = |projs: &[Option<LoraWeights>; 7], g: usize| -> Result<(Tensor, Tensor)> {
            let list = group_projs(g);
            let (fan_in, splits) = group_shape(cfg, g);
            let (pr, out) = (list.len() * r, *splits.last().unwrap_or(&0));
            let mut a = vec![0f32; pr * fan_in];
            let mut b = vec![0f32; out * r];
            for (pi, proj) in list.iter().enumerate() {
                let Some(w) = &projs[Proj::ALL.iter().position(|q| q == proj).unwrap_or(0)] else {
                    continue;
                };
                a[pi * r * fan_in..(pi * r + w.rank) * fan_in].copy_from_slice(&w.a);
                for (o, row) in (splits[pi]..splits[pi + 1]).zip(w.b.chunks(w.rank)) {
                    b[o * r..o * r + w.rank].copy_from_slice(row);
                }
            }
            Ok((
                Tensor::from_vec(a, (1, pr, fan_in), &Device::Cpu)?.to_dtype(dtype)?,
                Tensor::from_vec(b, (1, out, r), &Device::Cpu)?.to_dtype(dtype)?,
            ))
        };
        let layers = adapter
            .layers
            .iter()
            .map(|projs| {
                Ok([
                    group(projs, 0)?,
                    group(projs, 1)?,
                    group(projs, 2)?,
                    group(projs, 3)?,
                ])
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            digest: adapter.digest.clone(),
            rank: adapter.rank,
            targets: adapter.targets(),
            slot_rank: r,
            layers,
        })
    }
}

/// The LoRA tiles of a batch for the kernels: `(first token, count, slot)` triples of at most
/// `tile` consecutive tokens on one slot, for every token on an adapter (base tokens have
/// none), flattened; in the batch's order, or with `by_slot` in the order of their slots
/// (stable: by token within a slot), which the grouped kernels cut into groups of one slot
/// (`KernelOptions::lora_grouped`; the other kernels take the tiles in any order).
pub fn tiles(seqs: &[crate::engine::batch::SeqInput<'_>], tile: usize, by_slot: bool) -> Vec<u32> {
    let mut out = Vec::new();
    for s in segments(seqs) {
        let Some(slot) = s.slot else {
            continue;
        };
        let mut t = s.start;
        while t < s.start + s.len {
            let n = tile.min(s.start + s.len - t);
            out.extend([t as u32, n as u32, slot]);
            t += n;
        }
    }
    if by_slot {
        let mut triples: Vec<[u32; 3]> = out.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect();
        triples.sort_by_key(|c| c[2]);
        out = triples.concat();
    }
    out
}

/// [`tiles`] of a kernel step of `rows` rows (`rows` being the graph bucket's on a replay):
/// tiles of `cuda::lora_tile(rows)` tokens, sorted by slot when the grouped kernels or the
/// run shrink (`KernelOptions::lora_runs`) serve the step. The eager forward and the graph replay both take it from here, so a replayed bucket
/// and an eager step of as many rows lay the table out alike.
#[cfg(feature = "cuda")]
pub fn kernel_tiles(
    seqs: &[crate::engine::batch::SeqInput<'_>],
    rows: usize,
    k: Option<&crate::engine::cuda::CudaKernels>,
) -> Vec<u32> {
    let tile = crate::engine::cuda::lora_tile(rows);
    let by_slot = k.is_some_and(|k| k.lora_grouped_sorts(rows) || k.lora_runs_serve(rows, tile));
    tiles(seqs, tile, by_slot)
}

/// The segments of a batch: consecutive tokens of sequences on the same slot, in order.
pub fn segments(seqs: &[crate::engine::batch::SeqInput<'_>]) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    let mut start = 0;
    for s in seqs {
        match out.last_mut() {
            Some(last) if last.slot == s.adapter => last.len += s.q_len,
            _ => out.push(Segment {
                start,
                len: s.q_len,
                slot: s.adapter,
            }),
        }
        start += s.q_len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::batch::{LogitRows, SeqInput};

    fn seq(q_len: usize, adapter: Option<u32>) -> SeqInput<'static> {
        SeqInput {
            q_len,
            context_len: q_len,
            block_table: &[],
            logits: LogitRows::Last,
            adapter,
        }
    }

    /// Neighbours on one slot merge into one segment; tiles cut it into runs of at most the
    /// tile size and skip base tokens. Mutation: tiles over base tokens, or a merged run cut
    /// at the sequence boundary instead of the tile size.
    #[test]
    fn tiles_cover_every_adapter_token_once_in_runs_of_one_slot() {
        let seqs = [
            seq(3, Some(1)),
            seq(7, Some(1)),
            seq(2, None),
            seq(1, Some(0)),
        ];
        assert_eq!(
            segments(&seqs),
            vec![
                Segment {
                    start: 0,
                    len: 10,
                    slot: Some(1)
                },
                Segment {
                    start: 10,
                    len: 2,
                    slot: None
                },
                Segment {
                    start: 12,
                    len: 1,
                    slot: Some(0)
                },
            ]
        );
        assert_eq!(tiles(&seqs, 8, false), vec![0, 8, 1, 8, 2, 1, 12, 1, 0]);
    }

    /// By slot, the same tiles ordered by their slots, and by token within a slot (the
    /// grouped kernels read a group of one slot's tokens together). Mutation: an unstable or
    /// token-major order, or tiles lost or merged by the sort.
    #[test]
    fn tiles_by_slot_keep_every_tile_in_slot_then_token_order() {
        let seqs = [
            seq(1, Some(2)),
            seq(1, Some(0)),
            seq(1, None),
            seq(1, Some(2)),
            seq(2, Some(0)),
            seq(1, Some(1)),
        ];
        assert_eq!(
            tiles(&seqs, 1, false),
            vec![0, 1, 2, 1, 1, 0, 3, 1, 2, 4, 1, 0, 5, 1, 0, 6, 1, 1]
        );
        assert_eq!(
            tiles(&seqs, 1, true),
            vec![1, 1, 0, 4, 1, 0, 5, 1, 0, 6, 1, 1, 0, 1, 2, 3, 1, 2]
        );
    }
}
