//! LoRA steps of up to 64 rows with fewer launches on the critical path
//! (`LaunchOptions::lora_overlap`): the gate|up delta's expand is one launch with the SiLU
//! product, and the o and down deltas' expands are one launch with the add+RMSNorm after them
//! (`kernels/lora_silu.cu`; the same kernels read the wide matmul's output, `lora_wide.rs`);
//! in steps of more than `LaunchOptions::lora_side_min_rows` rows (none by default) each
//! shrink also runs on a second stream beside the base matmul that reads the same input (the
//! stream forks from the kernels' stream before it and the kernels' stream joins it before the
//! expand; inside a CUDA graph these become two branches).
//!
//! Invariant: every fork is joined before the step ends (a captured step must come back to
//! the capturing stream), and a shrink's scratch is written only after the kernels' stream
//! has queued the expand that reads the previous shrink's (the fork comes after it).

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaStream, LaunchConfig};
use candle_core::{DType, Tensor};

use super::kernels::CudaKernels;
use super::launch::{Launch, kernel_err};
use crate::error::Result;

/// The largest adapter rank the fused expand+SiLU takes (its kernels' `RMAX`: 16 and 64).
pub const LORA_OVERLAP_MAX_RANK: usize = 64;

impl CudaKernels {
    /// Whether LoRA shrinks run beside the base matmuls (`LaunchOptions::lora_overlap`).
    pub fn lora_overlap(&self) -> bool {
        self.lora_overlap.is_some()
    }

    /// Whether a LoRA step of `rows` rows runs the overlap's shrinks on the second stream
    /// (`LaunchOptions::lora_side_min_rows`).
    pub fn lora_side(&self, rows: usize) -> bool {
        self.lora_overlap
            .as_ref()
            .is_some_and(|o| rows > o.side_min_rows)
    }

    /// [`CudaKernels::lora_shrink_into`] on the second stream, after everything queued on the
    /// kernels' stream so far; [`CudaKernels::lora_join`] makes the kernels' stream wait for
    /// it. Without the overlap, on the kernels' stream.
    pub fn lora_shrink_beside(
        &self,
        x: &Tensor,
        a: &Tensor,
        tiles: (&Tensor, usize),
        y: &Tensor,
    ) -> Result<()> {
        let Some(o) = &self.lora_overlap else {
            return self.lora_shrink_into(x, a, tiles, y);
        };
        let err = |e| kernel_err("lora fork", e);
        o.fork.record(&self.stream).map_err(err)?;
        o.side.wait(&o.fork).map_err(err)?;
        self.lora_shrink_on(Some(&o.side), x, a, tiles, y)?;
        o.join.record(&o.side).map_err(err)
    }

    /// The overlap's handles, or an error naming `what` when they are not loaded.
    pub(super) fn overlap_kernels(&self, what: &str) -> Result<&super::handles::LoraOverlap> {
        self.lora_overlap
            .as_ref()
            .ok_or_else(|| kernel_err(what, "the LoRA overlap kernels are not loaded"))
    }

    /// The kernels' stream waits for the last shrink queued beside it (nothing without the
    /// overlap).
    pub fn lora_join(&self) -> Result<()> {
        match &self.lora_overlap {
            Some(o) => self
                .stream
                .wait(&o.join)
                .map_err(|e| kernel_err("lora join", e)),
            None => Ok(()),
        }
    }

    /// A launch of `f` on `side` (no programmatic dependent launch: the event is its
    /// dependency), or on the kernels' stream.
    pub(super) fn launcher_on<'a>(
        &'a self,
        side: Option<&'a CudaStream>,
        f: &'a CudaFunction,
    ) -> Launch<'a> {
        match side {
            Some(s) => Launch::new(s, f, false),
            None => self.launcher(f),
        }
    }

    /// The gate|up delta expanded into `gu` (`[T, 2n]`, from the shrink's `y` `[T, 2r]` and
    /// `b` `[slots, 2n, r]`) and `act = silu(gate) * up` (`[T, n]`) in one launch, for the
    /// tokens of the one-token `tiles`; tokens on no adapter get the plain product (`gu`
    /// itself is left as the matmul wrote it).
    pub fn lora_expand_silu_into(
        &self,
        gu: &Tensor,
        (y, b): (&Tensor, &Tensor),
        act: &Tensor,
        tiles: &Tensor,
    ) -> Result<()> {
        let o = self.overlap_kernels("lora silu")?;
        for x in [gu, b, act] {
            self.check_dtype(x)?;
        }
        let n = act.dim(candle_core::D::Minus1)?;
        let t = act.elem_count() / n.max(1);
        let (_, n2, r) = b.dims3()?;
        let fits = gu.elem_count() == t * 2 * n
            && n2 == 2 * n
            && rank_fits(r, tiles)
            && y.dtype() == DType::F32
            && y.elem_count() >= t * 2 * r;
        if !fits {
            return Err(kernel_err("lora silu", "shapes do not fit"));
        }
        if t == 0 {
            return Ok(());
        }
        let y_at = YAt {
            ptr: self.ptr(y)?,
            ld: 2 * r,
            slot: 0,
        };
        let f = &o.silu[usize::from(r > 16)];
        self.silu_launch(f, (self.ptr(gu)?, 2 * n), y_at, (b, act, tiles), t)
    }

    /// Launches `f` (`lora_expand_silu*`) for `t` rows: `gu` (address, row stride), `y` as
    /// `y_at` says, `b` `[slots, 2n, r]`, `act` `[T, n]` (the caller checked the shapes).
    pub(super) fn silu_launch(
        &self,
        f: &CudaFunction,
        (pgu, ldg): (u64, usize),
        y_at: YAt,
        (b, act, tiles): (&Tensor, &Tensor, &Tensor),
        t: usize,
    ) -> Result<()> {
        let (slots, n2, r) = b.dims3()?;
        let n = n2 / 2;
        let (pb, pact, pt) = (self.ptr(b)?, self.ptr(act)?, self.ptr(tiles)?);
        let [nt32, slots32, n32, r32] = [tiles.elem_count() / 3, slots, n, r].map(|v| v as i32);
        let [ldg32, ldy32, sy32] = [ldg, y_at.ld, y_at.slot].map(|v| v as i32);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256) as u32, t as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.launcher(f);
        l.arg(&pgu)
            .arg(&ldg32)
            .arg(&y_at.ptr)
            .arg(&ldy32)
            .arg(&sy32);
        l.arg(&pb).arg(&pact);
        l.arg(&pt).arg(&nt32).arg(&slots32).arg(&n32).arg(&r32);
        // SAFETY: argument types match `lora_expand_silu*`; the callers check the shapes.
        unsafe { l.launch(cfg) }.w()?;
        Ok(())
    }

    /// `add_rmsnorm` with the delta of the one-projection matmul before it (o, or the previous
    /// layer's down) expanded into `delta` first, for the rows of `tiles` (as
    /// [`CudaKernels::lora_into`] takes them): `d = delta + y · b[s]ᵀ` (rounded as the
    /// expand writes it; `y` `[T, r]` f32, `b` `[slots, n, r]`), `res_out = res + d`,
    /// `h = rmsnorm(res_out) * w` (rounded as `add_rmsnorm` rounds them: the same values as
    /// the expand and the norm launched apart).
    pub fn lora_add_rmsnorm_into(
        &self,
        (delta, res, res_out): (&Tensor, &Tensor, &Tensor),
        (w, eps): (&Tensor, f64),
        h: &Tensor,
        (y, b): (&Tensor, &Tensor),
        tiles: &Tensor,
    ) -> Result<()> {
        let o = self.overlap_kernels("lora norm")?;
        for x in [delta, res, res_out, w, h, b] {
            self.check_dtype(x)?;
        }
        let n = res.dim(candle_core::D::Minus1)?;
        let t = res.elem_count() / n.max(1);
        let (_, nb, r) = b.dims3()?;
        let fits = [delta, res_out, h].iter().all(|x| x.elem_count() == t * n)
            && w.elem_count() == n
            && nb == n
            && rank_fits(r, tiles)
            && y.dtype() == DType::F32
            && y.elem_count() >= t * r;
        if !fits {
            return Err(kernel_err("lora norm", "shapes do not fit"));
        }
        if t == 0 {
            return Ok(());
        }
        let y_at = YAt {
            ptr: self.ptr(y)?,
            ld: r,
            slot: 0,
        };
        let f = &o.norm[usize::from(r > 16)];
        let d = (self.ptr(delta)?, n);
        self.norm_launch(f, (d, res, res_out), (w, eps), h, (y_at, b), tiles)
    }

    /// Launches `f` (`lora_add_rmsnorm*`): `delta` (address, row stride), `res`/`res_out`/`h`
    /// `[T, n]`, `y` as `y_at` says, `b` `[slots, n, r]` (the caller checked the shapes).
    pub(super) fn norm_launch(
        &self,
        f: &CudaFunction,
        ((pd, ldd), res, res_out): ((u64, usize), &Tensor, &Tensor),
        (w, eps): (&Tensor, f64),
        h: &Tensor,
        (y_at, b): (YAt, &Tensor),
        tiles: &Tensor,
    ) -> Result<()> {
        let n = res.dim(candle_core::D::Minus1)?;
        let t = res.elem_count() / n.max(1);
        let (slots, _, r) = b.dims3()?;
        let (pr, pro) = (self.ptr(res)?, self.ptr(res_out)?);
        let (pw, ph, pb) = (self.ptr(w)?, self.ptr(h)?, self.ptr(b)?);
        let pt = self.ptr(tiles)?;
        let [n32, nt32, slots32, r32] = [n, tiles.elem_count() / 3, slots, r].map(|v| v as i32);
        let [ldd32, ldy32, sy32] = [ldd, y_at.ld, y_at.slot].map(|v| v as i32);
        let eps32 = eps as f32;
        let cfg = LaunchConfig {
            grid_dim: (t as u32, 1, 1),
            block_dim: (n.clamp(32, 1024).next_multiple_of(32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.launcher(f);
        l.arg(&pd)
            .arg(&ldd32)
            .arg(&pr)
            .arg(&pro)
            .arg(&pw)
            .arg(&ph)
            .arg(&n32)
            .arg(&eps32);
        l.arg(&y_at.ptr)
            .arg(&ldy32)
            .arg(&sy32)
            .arg(&pb)
            .arg(&pt)
            .arg(&nt32)
            .arg(&slots32)
            .arg(&r32);
        // SAFETY: argument types match `lora_add_rmsnorm*`; the callers check the shapes.
        unsafe { l.launch(cfg) }.w()?;
        Ok(())
    }
}

/// Whether the fused expands take adapters of (padded) rank `r` and the tile table `tiles`:
/// `r` a multiple of 8 up to [`LORA_OVERLAP_MAX_RANK`] (their `RMAX`), the table u32.
pub(super) fn rank_fits(r: usize, tiles: &Tensor) -> bool {
    r.is_multiple_of(8) && r <= LORA_OVERLAP_MAX_RANK && tiles.dtype() == DType::U32
}

/// Where a step's shrink `y` lies for the fused expands: its device address, and the
/// elements between two tokens' rows (`ld`) and between two slots' values in a row (`slot`:
/// 0 for the shrink kernels' `[T, P·r]`, `P·r` for the wide matmul's extra columns).
pub(super) struct YAt {
    pub(super) ptr: u64,
    pub(super) ld: usize,
    pub(super) slot: usize,
}
