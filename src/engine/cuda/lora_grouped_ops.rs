//! LoRA steps of one-token tiles with a slot's tokens read together
//! (`LaunchOptions::lora_grouped`, `kernels/lora_grouped.cu`): the tile table (at most 64
//! tiles) is cut into groups, runs of consecutive tiles on one slot in pieces of at most
//! eight, found by each block itself; the shrink runs on tensor cores, a block per 16 rows of
//! `a`, group and slice of the input features, and the expand loads each row of `b` once a
//! group, where the one-token kernels of `lora_ops.rs` read a slot's rows once per token. The
//! forward sorts the tile table of the steps they serve by slot (`model::lora_slots::tiles`
//! with `by_slot`) so a slot's tokens make as few groups as they can; any order is served.
//! The grid has a row of blocks for every tile (the most groups there can be; a launch's shape
//! must not depend on the table, which graphs replay): blocks past the last group return at
//! once. By default only the shrinks over at most 1,024 input features take them (see
//! `shrink_pays`); `CudaKernels::set_lora_grouped_everywhere` gives them every shrink and
//! expand (profiling, checks).
//!
//! Invariant: the grouped kernels write the same `y` (`[T, P * r]` f32, as the shrink of
//! `lora_ops.rs` writes it; the partial sums of a split shrink lie after it in the same
//! scratch) and the expand the same bits given the same `y`, so every consumer of `y` (the
//! overlap's fused expands included) takes either shrink.

use candle_core::Tensor;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;

use super::handles::LoraGrouped;
use super::kernels::CudaKernels;
use crate::error::Result;

/// Steps of more rows than this (and at most [`super::LORA_TILE_ONE_MAX`]) take the grouped
/// kernels; smaller ones keep the one-token kernels, which are faster there (H200, 16 rows:
/// qkv shrink 2.0 against 2.8 us grouped, gate|up 1.3 against 2.7; at 64 rows the grouped
/// ones win where a projection has 32-48 rows of `a` over at most 1,024 features).
pub const LORA_GROUPED_MIN_ROWS: usize = 32;

/// Most slices of the input features one grouped shrink splits into (partial sums in the
/// scratch after `y`; see [`lora_scratch_cols`]).
pub const LORA_GROUPED_SLICES: usize = 16;

/// The largest adapter rank the grouped expand takes (its kernels' `RMAX`: 16 and 64).
const GROUPED_MAX_RANK: usize = 64;

/// Most tiles of a step the grouped kernels take (one per thread of their first two warps).
const MAX_TILES: usize = 64;

/// Input features of one slice of a warp (32) for each of the shrink's 4 warps.
const SLICE_QUANTUM: usize = 128;

/// Counters of the split shrink's (rows, group) pairs.
const COUNTERS: usize = super::handles::LORA_GROUPED_COUNTERS;

/// Whether the grouped shrink of `pr` rows of `a` over `fan_in` input features serves a step
/// by default: where it won on the H200 (`graph_check --profile 64`, 8 rank-16 adapters, a
/// slot per row; BENCHMARKS.md), the 0.6B's qkv (48 rows over 1,024 features: 2.9 against 5.5
/// us one-token) and gate|up (32 rows: 2.8 against 4.0), whole (one slice). It loses where a
/// projection of 16 rows leaves it a row of blocks per group (o: 4.4 against 2.5, down: 4.1
/// against 3.0); the 1.7B's qkv won alone (4.6 against 5.9) but not in the step (decode at
/// batch 64 -0.5%), its gate|up lost (4.5 against 4.2). The grouped expand lost in every shape
/// (0.6B qkv 4.1 against 3.1, o 2.5 against 1.6): steps keep the one-token expand
/// ([`CudaKernels::set_lora_grouped_everywhere`] turns both on everywhere).
fn shrink_pays(pr: usize, fan_in: usize) -> bool {
    pr >= 32 && fan_in <= SLICE_FEATURES
}

/// Input features of one block's slice at most, where the features allow: 16 rows of `a` x
/// 1,024 bf16 = 32 KB a block, two rounds of loads a warp.
const SLICE_FEATURES: usize = 1024;

/// Columns per row of the LoRA scratch for adapters of (padded) rank `r`: `y` of up to three
/// projections, and with `grouped` room for the split shrink's partial sums after it.
pub fn lora_scratch_cols(r: usize, grouped: bool) -> usize {
    3 * r * if grouped { 1 + LORA_GROUPED_SLICES } else { 1 }
}

/// Slices of `fan_in` for a grouped shrink with `room` slices of partial sums in the scratch:
/// `asked` when it is one the shrink can take (a power of two within the room whose slices
/// are multiples of [`SLICE_QUANTUM`]), else powers of two until a slice is at most
/// [`SLICE_FEATURES`] (each split costs the last block a round trip through memory).
fn slices_for(fan_in: usize, room: usize, asked: Option<usize>) -> usize {
    let max = LORA_GROUPED_SLICES.min(room).max(1);
    let ok = |s: usize| s.is_power_of_two() && s <= max && fan_in.is_multiple_of(s * SLICE_QUANTUM);
    if let Some(s) = asked.filter(|&s| ok(s)) {
        return s;
    }
    let mut s = 1;
    while fan_in / s > SLICE_FEATURES && ok(s * 2) {
        s *= 2;
    }
    s
}

impl CudaKernels {
    /// Whether steps of one-token tiles read a slot's tokens together
    /// (`LaunchOptions::lora_grouped`; bf16 only).
    pub fn lora_grouped(&self) -> bool {
        self.lora_grouped.is_some()
    }

    /// Profiling: grouped shrinks split their input features into `slices` (a power of two up
    /// to [`LORA_GROUPED_SLICES`]; ignored where a shape cannot take it) instead of the rule
    /// (1,024 input features a block); None restores the rule. Nothing without the grouped
    /// kernels.
    pub fn set_lora_grouped_slices(&self, slices: Option<usize>) {
        if let Some(g) = &self.lora_grouped {
            let n = slices.unwrap_or(0);
            g.slices.store(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Profiling and checks: the grouped kernels take every shrink and expand of the steps
    /// they serve (`true`), not only the shrinks where they measured faster (`false`, the
    /// default). Nothing without the grouped kernels.
    pub fn set_lora_grouped_everywhere(&self, everywhere: bool) {
        if let Some(g) = &self.lora_grouped {
            g.everywhere
                .store(everywhere, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Whether the grouped expand serves a step of `rows` rows with `ntiles` tiles (only
    /// with [`CudaKernels::set_lora_grouped_everywhere`]).
    pub fn lora_grouped_expands(&self, rows: usize, ntiles: usize) -> bool {
        self.lora_grouped_serves(rows, ntiles)
            && self.lora_grouped.as_ref().is_some_and(|g| g.everywhere())
    }

    /// Whether the grouped kernels serve a step of `rows` rows on one-token tiles with a tile
    /// table of `ntiles` entries (padding included): with the option, 33-64 rows, at most 64
    /// tiles (bf16 adapters of rank up to 64 for the expand).
    pub fn lora_grouped_serves(&self, rows: usize, ntiles: usize) -> bool {
        self.grouped_for(rows, 1).is_some() && ntiles <= MAX_TILES
    }

    /// Whether a step of `rows` rows gets its tile table sorted by slot: the grouped kernels
    /// serve it (other steps keep the table in row order, as without the option).
    pub fn lora_grouped_sorts(&self, rows: usize) -> bool {
        self.grouped_for(rows, super::lora_tile(rows)).is_some()
    }

    /// The grouped kernels, when they serve a step of `t` rows on `tile`-token tiles.
    fn grouped_for(&self, t: usize, tile: usize) -> Option<&LoraGrouped> {
        self.lora_grouped
            .as_ref()
            .filter(|_| super::lora_ops::one_token_step(t, tile, LORA_GROUPED_MIN_ROWS))
    }

    /// The grouped shrink of [`CudaKernels::lora_shrink_into`] when it serves the step (true),
    /// else nothing (false). Shapes as checked there.
    pub(super) fn lora_shrink_grouped(
        &self,
        side: Option<&candle_core::cuda_backend::cudarc::driver::CudaStream>,
        (x, a): (&Tensor, &Tensor),
        (tiles, tile): (&Tensor, usize),
        y: &Tensor,
    ) -> Result<bool> {
        let (slots, pr, fan_in) = a.dims3()?;
        let t = x.elem_count() / fan_in.max(1);
        let Some(g) = self.grouped_for(t, tile) else {
            return Ok(false);
        };
        let ntiles = tiles.elem_count() / 3;
        let mtiles = pr.div_ceil(16);
        let room = (y.elem_count() / (t * pr).max(1)).saturating_sub(1);
        let fits = (g.everywhere() || shrink_pays(pr, fan_in))
            && fan_in.is_multiple_of(SLICE_QUANTUM)
            && ntiles <= MAX_TILES
            && mtiles * ntiles <= COUNTERS
            && pr > 0;
        if !fits {
            return Ok(false);
        }
        let asked = g.slices.load(std::sync::atomic::Ordering::Relaxed);
        let slices = slices_for(fan_in, room, (asked > 0).then_some(asked));
        let (px, pa, ps, py) = (self.ptr(x)?, self.ptr(a)?, self.ptr(tiles)?, self.ptr(y)?);
        // The partial sums after y (f32).
        let ppart = py + (t * pr * 4) as u64;
        let pc = self.ptr(&g.counters)?;
        let [nt32, rows32, in32, pr32, slots32] = [ntiles, t, fan_in, pr, slots].map(|v| v as i32);
        let cfg = LaunchConfig {
            grid_dim: (mtiles as u32, ntiles as u32, slices as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.launcher_on(side, &g.shrink);
        l.arg(&px).arg(&pa).arg(&ps).arg(&nt32).arg(&py).arg(&ppart);
        l.arg(&pc).arg(&rows32).arg(&in32).arg(&pr32).arg(&slots32);
        // SAFETY: argument types match `lora_shrink_grouped_bf16`; the caller checked the
        // shapes, the scratch holds `slices` partial copies of y after it (`room`), and the
        // counters hold `mtiles * ntiles` entries.
        unsafe { l.launch(cfg) }.w()?;
        Ok(true)
    }

    /// The grouped expand of [`CudaKernels::lora_expand_into`] when it serves the step (true),
    /// else nothing (false). Shapes as checked there; `(s1, s2)` the projections' splits.
    pub(super) fn lora_expand_grouped(
        &self,
        (y, b): (&Tensor, &Tensor),
        (tiles, tile): (&Tensor, usize),
        out: &Tensor,
        (pr, s1, s2): (usize, i32, i32),
    ) -> Result<bool> {
        let (slots, nout, r) = b.dims3()?;
        let t = out.elem_count() / nout.max(1);
        let Some(g) = self.grouped_for(t, tile) else {
            return Ok(false);
        };
        let ntiles = tiles.elem_count() / 3;
        if !g.everywhere() || r > GROUPED_MAX_RANK || ntiles > MAX_TILES {
            return Ok(false);
        }
        let (pb, ps, py, po) = (self.ptr(b)?, self.ptr(tiles)?, self.ptr(y)?, self.ptr(out)?);
        let [nt32, n32, r32, pr32, slots32] = [ntiles, nout, r, pr, slots].map(|v| v as i32);
        let cfg = LaunchConfig {
            grid_dim: (nout.div_ceil(128) as u32, ntiles as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.launcher(&g.expand[usize::from(r > 16)]);
        l.arg(&py).arg(&pb).arg(&ps).arg(&nt32).arg(&po).arg(&n32);
        l.arg(&r32).arg(&pr32).arg(&s1).arg(&s2).arg(&slots32);
        // SAFETY: argument types match `lora_expand_grouped_r*_bf16`; r <= the kernel's RMAX
        // and the caller checked the shapes.
        unsafe { l.launch(cfg) }.w()?;
        Ok(true)
    }
}

// Pure host arithmetic; these run with `cargo test --features cuda` (no GPU needed).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_bound_a_block_s_features_within_the_room() {
        // 0.6B qkv / gate|up (1,024 features): whole; o (2,048): 2; down (3,072): 4.
        assert_eq!(slices_for(1024, 16, None), 1);
        assert_eq!(slices_for(2048, 16, None), 2);
        assert_eq!(slices_for(3072, 16, None), 4);
        // 1.7B down (6,144): 8; the scratch's room bounds it.
        assert_eq!(slices_for(6144, 16, None), 8);
        assert_eq!(slices_for(6144, 3, None), 2);
        // Features not a multiple of two slices' quantum stay whole.
        assert_eq!(slices_for(1152, 16, None), 1);
        // Asked for: taken when possible, else the rule.
        assert_eq!(slices_for(1024, 16, Some(8)), 8);
        assert_eq!(slices_for(1024, 16, Some(3)), 1);
        assert_eq!(slices_for(1024, 16, Some(16)), 1);
        assert_eq!(slices_for(6144, 4, Some(16)), 4);
    }

    #[test]
    fn the_shrink_is_grouped_where_it_measured_faster() {
        // 0.6B: qkv (48 rows) and gate|up (32) over 1,024 features; not o or down (16 rows).
        assert!(shrink_pays(48, 1024) && shrink_pays(32, 1024));
        assert!(!shrink_pays(16, 2048) && !shrink_pays(16, 3072));
        // 1.7B (2,048 features): neither qkv nor gate|up.
        assert!(!shrink_pays(48, 2048) && !shrink_pays(32, 2048));
    }

    #[test]
    fn the_scratch_has_room_for_every_slice() {
        assert_eq!(lora_scratch_cols(16, false), 48);
        assert_eq!(lora_scratch_cols(16, true), 48 * (1 + LORA_GROUPED_SLICES));
    }
}
