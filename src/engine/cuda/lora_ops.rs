//! Launches of the LoRA kernels (`kernels/lora.cu`): a fused matmul's output gains, for each
//! token on an adapter, `b[slot] · (a[slot] · x)` — shrink into an f32 scratch, then expand
//! into the output in place, both by tiles of up to [`LORA_TILE`] consecutive tokens on one
//! slot (each block reads its adapter rows once per tile). With `LaunchOptions::lora_grouped`
//! steps of 33-64 rows take the grouped kernels instead (`lora_grouped_ops.rs`), with
//! `LaunchOptions::lora_runs` the other shrinks of steps of 17-64 rows the run shrink
//! (`lora_runs.rs`).

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaStream, LaunchConfig};
use candle_core::{DType, Tensor};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::error::Result;

/// Most tokens of one LoRA tile.
pub const LORA_TILE: usize = 8;

/// Steps of at most this many tokens take tiles of one token (their blocks are few and
/// latency-bound; a wider tile only adds work per block).
pub const LORA_TILE_ONE_MAX: usize = 64;

/// Whether a step of `rows` rows on `tile`-token tiles is one the one-token kernels' variants
/// that start above `above` rows take (the grouped and the run kernels: one-token tiles,
/// `above + 1..=`[`LORA_TILE_ONE_MAX`] rows).
pub(super) fn one_token_step(rows: usize, tile: usize, above: usize) -> bool {
    tile == 1 && (above + 1..=LORA_TILE_ONE_MAX).contains(&rows)
}

/// The tile size for a step of `t` tokens: 1 up to [`LORA_TILE_ONE_MAX`], else
/// [`LORA_TILE`].
pub fn lora_tile(t: usize) -> usize {
    if t <= LORA_TILE_ONE_MAX { 1 } else { LORA_TILE }
}

impl CudaKernels {
    /// `out[t] += b[s] · (a[s] · x[t])` for the tokens of each tile of `tiles` (u32
    /// `[tiles, 3]`: first token, count of at most `tile` (1 or [`LORA_TILE`]; 0: none), slot; tokens
    /// outside every tile, and slots past those held, are left alone). `a`: `[slots, P * r,
    /// in]`, `b`: `[slots, out, r]`, `splits`: the first output row of each of the `P` (1-3)
    /// projections and `out` at the end; `y`: f32 scratch of at least `T * P * r`. The tiles'
    /// tokens must lie within `x`'s rows (the caller's to build).
    pub fn lora_into(
        &self,
        x: &Tensor,
        (a, b, splits): (&Tensor, &Tensor, &[usize]),
        (tiles, tile): (&Tensor, usize),
        y: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let fan_in = a.dim(2)?;
        let nout = b.dim(1)?;
        let t = x.elem_count() / fan_in.max(1);
        if out.elem_count() != t * nout {
            return Err(kernel_err("lora", "shapes do not fit"));
        }
        self.lora_shrink_into(x, a, (tiles, tile), y)?;
        self.lora_expand_into(y, (b, splits), (tiles, tile), out)
    }

    /// The shrink half of [`CudaKernels::lora_into`]: `y[t] = a[s] · x[t]` (f32 `[T, P * r]`)
    /// for the tokens of each tile.
    pub fn lora_shrink_into(
        &self,
        x: &Tensor,
        a: &Tensor,
        tiles: (&Tensor, usize),
        y: &Tensor,
    ) -> Result<()> {
        self.lora_shrink_on(None, x, a, tiles, y)
    }

    /// [`CudaKernels::lora_shrink_into`] on `side` (or the kernels' stream).
    pub(super) fn lora_shrink_on(
        &self,
        side: Option<&CudaStream>,
        x: &Tensor,
        a: &Tensor,
        (tiles, tile): (&Tensor, usize),
        y: &Tensor,
    ) -> Result<()> {
        for t in [x, a] {
            self.check_dtype(t)?;
        }
        let (slots, pr, fan_in) = a.dims3()?;
        let t = x.elem_count() / fan_in.max(1);
        let ntiles = tiles.elem_count() / 3;
        let fits = x.elem_count() == t * fan_in
            && tiles.dtype() == DType::U32
            && tiles.elem_count() == 3 * ntiles
            && y.dtype() == DType::F32
            && y.elem_count() >= t * pr
            && (tile == 1 || tile == LORA_TILE)
            && fan_in.is_multiple_of(8);
        if !fits {
            return Err(kernel_err("lora shrink", "shapes do not fit"));
        }
        if ntiles == 0
            || t == 0
            || self.lora_shrink_grouped(side, (x, a), (tiles, tile), y)?
            || self.lora_shrink_runs(side, (x, a), (tiles, tile), y)?
        {
            return Ok(());
        }
        let (px, pa, ps, py) = (self.ptr(x)?, self.ptr(a)?, self.ptr(tiles)?, self.ptr(y)?);
        let (in32, pr32, slots32) = (fan_in as i32, pr as i32, slots as i32);
        let cfg = LaunchConfig {
            // Tiles of one token: a block per row of a; wider: a warp per row.
            grid_dim: (
                if tile == 1 { pr } else { pr.div_ceil(8) } as u32,
                ntiles as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let fs = &self.lora[usize::from(tile != 1)];
        let mut l = self.launcher_on(side, &fs[0]);
        l.arg(&px)
            .arg(&pa)
            .arg(&ps)
            .arg(&py)
            .arg(&in32)
            .arg(&pr32)
            .arg(&slots32);
        // SAFETY: argument types match `lora_shrink_*`; shapes are checked above.
        unsafe { l.launch(cfg) }.w()?;
        Ok(())
    }

    /// The expand half of [`CudaKernels::lora_into`]: `out[t] += b[s] · y[t]` for the tokens
    /// of each tile, `y` as [`CudaKernels::lora_shrink_into`] wrote it.
    pub fn lora_expand_into(
        &self,
        y: &Tensor,
        (b, splits): (&Tensor, &[usize]),
        (tiles, tile): (&Tensor, usize),
        out: &Tensor,
    ) -> Result<()> {
        for t in [b, out] {
            self.check_dtype(t)?;
        }
        let (slots, nout, r) = b.dims3()?;
        let t = out.elem_count() / nout.max(1);
        let ntiles = tiles.elem_count() / 3;
        let parts = splits.len().saturating_sub(1);
        let pr = parts * r;
        let fits = out.elem_count() == t * nout
            && (1..=3).contains(&parts)
            && splits.last() == Some(&nout)
            && tiles.dtype() == DType::U32
            && tiles.elem_count() == 3 * ntiles
            && y.dtype() == DType::F32
            && y.elem_count() >= t * pr
            && (tile == 1 || tile == LORA_TILE)
            && r.is_multiple_of(8)
            && tile * pr * 4 <= 48 * 1024;
        if !fits {
            return Err(kernel_err("lora expand", "shapes do not fit"));
        }
        if ntiles == 0 || t == 0 {
            return Ok(());
        }
        let s1 = splits.get(1).copied().filter(|_| parts > 1).unwrap_or(nout) as i32;
        let s2 = splits.get(2).copied().filter(|_| parts > 2).unwrap_or(nout) as i32;
        if self.lora_expand_grouped((y, b), (tiles, tile), out, (pr, s1, s2))? {
            return Ok(());
        }
        let (pb, ps, py, po) = (self.ptr(b)?, self.ptr(tiles)?, self.ptr(y)?, self.ptr(out)?);
        let (pr32, slots32, n32, r32) = (pr as i32, slots as i32, nout as i32, r as i32);
        let cfg = LaunchConfig {
            grid_dim: (nout.div_ceil(256) as u32, ntiles as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: (tile * pr * 4) as u32,
        };
        let fs = &self.lora[usize::from(tile != 1)];
        let mut l = self.launcher(&fs[1]);
        l.arg(&py).arg(&pb).arg(&ps).arg(&po).arg(&n32).arg(&r32);
        l.arg(&pr32).arg(&s1).arg(&s2).arg(&slots32);
        // SAFETY: argument types match `lora_expand_*`; the scratch was written by the
        // shrink before, on this stream.
        unsafe { l.launch(cfg) }.w()?;
        Ok(())
    }
}
