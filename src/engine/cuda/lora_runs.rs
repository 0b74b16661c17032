//! The LoRA shrink of steps of 17-64 rows on one-token tiles, by runs of the tile table
//! (`LaunchOptions::lora_runs`, `kernels/lora_runs.cu`): the forward sorts the table of those
//! steps by slot, and a block takes eight neighbouring tiles (a warp each, two rows of `a`), so
//! the warps of one slot read its rows of `a` once from L2 instead of once per token. The
//! launch's grid depends only on the step's rows and its table's length, never on the table's
//! contents, so graphs replay it with any mix of adapters. The expands stay the one-token
//! ones (an expand by runs, bit for bit theirs, measured slower on the H200: its few blocks
//! each take eight tokens one after the other).
//!
//! Invariant: the run shrink writes the same `y` layout (`[T, P * r]` f32) as the one-token
//! shrink, each entry summed in one order of its own, independent of the table's order.

use candle_core::Tensor;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaStream, LaunchConfig};

use super::handles::LoraRuns;
use super::kernels::CudaKernels;
use crate::error::Result;

/// Steps of more rows than this (and at most [`super::LORA_TILE_ONE_MAX`]) take the run
/// shrink: smaller steps hold a token or two per slot, where the one-token shrink is as good
/// (H200, 16 rows: the same 1.2-2.3 us a launch).
pub const LORA_RUNS_MIN_ROWS: usize = 16;

/// Tiles (one warp each) a block of the run shrink takes.
const RUN_SHRINK: usize = 8;

/// The run shrink takes fan-ins up to this (two rows of `a` a warp, eight loads a lane in
/// flight: 4,096 inputs are two rounds of loads; the 1.7B's down, 6,144, three, measured
/// slower than the one-token shrink on the H200: 4.4 against 3.9 us at 64 rows).
const RUNS_SHRINK_MAX_IN: usize = 4096;

/// Shrinks of fewer rows of `a` than this (o and down at rank 16: 16 rows, two warps' worth
/// a tile) take the run shrink only in steps of more than [`RUNS_NARROW_MIN_ROWS`] rows: with
/// fewer, its few blocks do serially what the one-token shrink's blocks do side by side
/// (H200, 32 rows: o and down, 32 blocks, 1.7 / 2.4 us against 1.4 / 1.7; qkv and gate|up at
/// 32 rows and every projection at 64 rows, 64-192 blocks, 1.4-2.5 us against 2.3-6.0). The
/// rule goes by the graph buckets' bounds (steps of 17-32 rows replay on the bucket of 32,
/// 33-64 on 64), so an eager step and its bucket's replay take the same shrink.
const RUNS_NARROW_PR: usize = 32;

/// See [`RUNS_NARROW_PR`].
const RUNS_NARROW_MIN_ROWS: usize = 32;

/// Whether the run shrink takes a launch of `pr` rows of `a` over `fan_in` inputs in a step of
/// `rows` rows (within the served 17-64).
fn shrink_pays(pr: usize, fan_in: usize, rows: usize) -> bool {
    fan_in <= RUNS_SHRINK_MAX_IN && (pr >= RUNS_NARROW_PR || rows > RUNS_NARROW_MIN_ROWS)
}

impl CudaKernels {
    /// Whether the run shrink is loaded (`LaunchOptions::lora_runs`).
    pub fn lora_runs(&self) -> bool {
        self.lora_runs.is_some()
    }

    /// Whether the run shrink serves a step of `rows` rows on `tile`-token tiles (the forward
    /// then sorts its tile table by slot).
    pub fn lora_runs_serve(&self, rows: usize, tile: usize) -> bool {
        self.runs_for(rows, tile).is_some()
    }

    /// The run kernels, when they serve a step of `rows` rows on `tile`-token tiles.
    fn runs_for(&self, rows: usize, tile: usize) -> Option<&LoraRuns> {
        self.lora_runs
            .as_ref()
            .filter(|_| super::lora_ops::one_token_step(rows, tile, LORA_RUNS_MIN_ROWS))
    }

    /// The run shrink of [`CudaKernels::lora_shrink_into`] when it serves the step (true),
    /// else nothing (false). Shapes as checked there.
    pub(super) fn lora_shrink_runs(
        &self,
        side: Option<&CudaStream>,
        (x, a): (&Tensor, &Tensor),
        (tiles, tile): (&Tensor, usize),
        y: &Tensor,
    ) -> Result<bool> {
        let (slots, pr, fan_in) = a.dims3()?;
        let t = x.elem_count() / fan_in.max(1);
        let Some(k) = self
            .runs_for(t, tile)
            .filter(|_| shrink_pays(pr, fan_in, t))
        else {
            return Ok(false);
        };
        let ntiles = tiles.elem_count() / 3;
        let (px, pa, ps, py) = (self.ptr(x)?, self.ptr(a)?, self.ptr(tiles)?, self.ptr(y)?);
        let [nt32, in32, pr32, slots32] = [ntiles, fan_in, pr, slots].map(|v| v as i32);
        let cfg = LaunchConfig {
            grid_dim: (pr.div_ceil(2) as u32, ntiles.div_ceil(RUN_SHRINK) as u32, 1),
            block_dim: (32 * RUN_SHRINK as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.launcher_on(side, &k.shrink);
        l.arg(&px).arg(&pa).arg(&ps).arg(&nt32).arg(&py);
        l.arg(&in32).arg(&pr32).arg(&slots32);
        // SAFETY: argument types match `lora_shrink_runs_*`; the caller checked the shapes
        // (fan-in a multiple of 8, y of at least T * pr floats).
        unsafe { l.launch(cfg) }.w()?;
        Ok(true)
    }
}

// Pure host arithmetic; these run with `cargo test --features cuda` (no GPU needed).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_shrink_takes_the_launches_where_it_measured_faster() {
        // 17-32 rows: qkv (48 rows of a) and gate|up (32), not o or down (16).
        assert!(shrink_pays(48, 1024, 32) && shrink_pays(32, 2048, 17));
        assert!(!shrink_pays(16, 2048, 32) && !shrink_pays(16, 3072, 20));
        // 33-64 rows: every projection over at most 4,096 inputs.
        assert!(shrink_pays(16, 2048, 33) && shrink_pays(16, 3072, 64));
        assert!(!shrink_pays(16, 6144, 64));
        // Rank 8: qkv's 24 rows of a count as narrow.
        assert!(!shrink_pays(24, 1024, 32) && shrink_pays(24, 1024, 40));
    }
}
