//! LoRA steps of 17-64 rows on one-token tiles read by runs of the tile table
//! (`LaunchOptions::lora_runs`, `kernels/lora_runs.cu`): the forward sorts the table of those
//! steps by slot, and a block takes several neighbouring tiles, reading each adapter row once
//! for the tiles of one slot next to each other instead of once per token. The shrink takes a
//! warp per tile (eight tiles a block) and two rows of `a`; the expand in place eight tiles a
//! block (ranks up to 16; two up to 64), the gate|up expand with the SiLU four (two). A
//! launch's grid depends only on the step's rows and its table's length, never on the
//! table's contents, so graphs replay them with any mix of adapters.
//!
//! Invariant: the run expands write the bits of the one-token expands of `lora_ops.rs` and
//! `lora_overlap.rs` from the same `y`; the run shrink writes the same `y` layout (`[T, P *
//! r]` f32) with each entry summed in one order of its own, independent of the table's order.

use candle_core::Tensor;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaStream, LaunchConfig};

use super::handles::LoraRuns;
use super::kernels::CudaKernels;
use crate::error::Result;

/// Steps of more rows than this (and at most [`super::LORA_TILE_ONE_MAX`]) take the run
/// kernels: smaller steps hold a token or two per slot, where a block per token is as good.
pub const LORA_RUNS_MIN_ROWS: usize = 16;

/// Tiles (one warp each) a block of the run shrink takes.
const RUN_SHRINK: usize = 8;

/// Tiles a block of the run expand takes, for ranks up to 16 and up to 64 (`RUN_E` of
/// `kernels/lora_runs.cu`: their rows of `b` live in registers).
const RUN_EXPAND: [usize; 2] = [8, 2];

/// Tiles a block of the run expand+SiLU takes (`RUN_S`: two rows of `b` a tile).
const RUN_SILU: [usize; 2] = [4, 2];

/// The largest rank the run expands take (their `RMAX`).
const RUNS_MAX_RANK: usize = 64;

impl CudaKernels {
    /// Whether the run kernels are loaded (`LaunchOptions::lora_runs`).
    pub fn lora_runs(&self) -> bool {
        self.lora_runs.is_some()
    }

    /// Whether the run kernels serve a step of `rows` rows on `tile`-token tiles (the forward
    /// then sorts its tile table by slot).
    pub fn lora_runs_serve(&self, rows: usize, tile: usize) -> bool {
        self.runs_for(rows, tile).is_some()
    }

    /// The run kernels, when they serve a step of `rows` rows on `tile`-token tiles.
    fn runs_for(&self, rows: usize, tile: usize) -> Option<&LoraRuns> {
        let served = LORA_RUNS_MIN_ROWS + 1..=super::LORA_TILE_ONE_MAX;
        self.lora_runs
            .as_ref()
            .filter(|_| tile == 1 && served.contains(&rows))
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
        let Some(k) = self.runs_for(t, tile) else {
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

    /// The run expand of [`CudaKernels::lora_expand_into`] when it serves the step (true),
    /// else nothing (false). Shapes as checked there; `(s1, s2)` the projections' splits.
    pub(super) fn lora_expand_runs(
        &self,
        (y, b): (&Tensor, &Tensor),
        (tiles, tile): (&Tensor, usize),
        out: &Tensor,
        (pr, s1, s2): (usize, i32, i32),
    ) -> Result<bool> {
        let (slots, nout, r) = b.dims3()?;
        let t = out.elem_count() / nout.max(1);
        let Some(k) = self.runs_for(t, tile) else {
            return Ok(false);
        };
        if r > RUNS_MAX_RANK {
            return Ok(false);
        }
        let wide = usize::from(r > 16);
        let ntiles = tiles.elem_count() / 3;
        let (pb, ps, py, po) = (self.ptr(b)?, self.ptr(tiles)?, self.ptr(y)?, self.ptr(out)?);
        let [nt32, n32, r32, pr32, slots32] = [ntiles, nout, r, pr, slots].map(|v| v as i32);
        let cfg = LaunchConfig {
            grid_dim: (
                nout.div_ceil(256) as u32,
                ntiles.div_ceil(RUN_EXPAND[wide]) as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.launcher(&k.expand[wide]);
        l.arg(&py).arg(&pb).arg(&ps).arg(&nt32).arg(&po).arg(&n32);
        l.arg(&r32).arg(&pr32).arg(&s1).arg(&s2).arg(&slots32);
        // SAFETY: argument types match `lora_expand_runs_r*`; r <= the kernel's RMAX and at
        // most three projections (pr <= 3 * RMAX, its shared memory), shapes checked by the
        // caller.
        unsafe { l.launch(cfg) }.w()?;
        Ok(true)
    }

    /// The run expand+SiLU of [`CudaKernels::lora_expand_silu_into`] when it serves the step
    /// (true), else nothing (false). Shapes as checked there.
    pub(super) fn lora_expand_silu_runs(
        &self,
        gu: &Tensor,
        (y, b): (&Tensor, &Tensor),
        act: &Tensor,
        tiles: &Tensor,
    ) -> Result<bool> {
        let n = act.dim(candle_core::D::Minus1)?;
        let t = act.elem_count() / n.max(1);
        let Some(k) = self.runs_for(t, 1) else {
            return Ok(false);
        };
        let (slots, _, r) = b.dims3()?;
        if r > RUNS_MAX_RANK {
            return Ok(false);
        }
        let wide = usize::from(r > 16);
        let run = RUN_SILU[wide];
        let ntiles = tiles.elem_count() / 3;
        let (pgu, py, pb) = (self.ptr(gu)?, self.ptr(y)?, self.ptr(b)?);
        let (pact, pt) = (self.ptr(act)?, self.ptr(tiles)?);
        let [nt32, slots32, n32, r32, t32] = [ntiles, slots, n, r, t].map(|v| v as i32);
        let cfg = LaunchConfig {
            // The tiles' tokens, then the step's rows (those on no adapter).
            grid_dim: (
                n.div_ceil(256) as u32,
                (ntiles.div_ceil(run) + t.div_ceil(run)) as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.launcher(&k.silu[wide]);
        l.arg(&pgu).arg(&py).arg(&pb).arg(&pact);
        l.arg(&pt)
            .arg(&nt32)
            .arg(&slots32)
            .arg(&n32)
            .arg(&r32)
            .arg(&t32);
        // SAFETY: argument types match `lora_expand_silu_runs_r*`; r <= the kernel's RMAX,
        // shapes checked by the caller.
        unsafe { l.launch(cfg) }.w()?;
        Ok(true)
    }
}
