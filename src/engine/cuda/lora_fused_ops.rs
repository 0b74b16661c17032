//! Launches of the LoRA decode path with the deltas fused into the step's norms and SiLU
//! (`kernels/lora_fused.cu`; `LaunchOptions::lora_fused`):
//! steps whose LoRA tiles are one token each. Per layer the deltas then take two launches
//! besides the base's (the qkv expand and the o shrink, [`super::lora_ops`]) instead of eight.

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::error::Result;

/// The largest adapter rank the fused path takes (its kernels' `RMAX`: 16 and 64).
pub const LORA_FUSED_MAX_RANK: usize = 64;

/// The largest hidden size the fused norm takes (`NS_CHUNKS * 256 * 8` in
/// `kernels/lora_fused.cu`).
pub const LORA_FUSED_MAX_HIDDEN: usize = 8192;

/// Rows of `a` one block of the fused norm shrinks (`NS_ROWS`).
const NS_ROWS: usize = 16;

/// Columns of the SiLU product one block of the fused SiLU takes (its down-shrink partials
/// are per block of this many columns).
pub const LORA_SILU_COLS: usize = 256;

impl CudaKernels {
    /// Whether the fused LoRA decode kernels are loaded (`LaunchOptions::lora_fused`).
    pub fn lora_fused(&self) -> bool {
        self.lora_fused.is_some()
    }

    /// The add+RMSNorm of a LoRA decode step with the deltas on both sides, for the tokens
    /// of `tiles` (one-token tiles, as [`CudaKernels::lora_into`] takes them):
    /// `expand` (`(y, parts, b)`: f32 `y` `[T, parts, r]`, `b` `[slots, K, r]`) first adds
    /// `(sum of y's parts) · bᵀ` of the token's slot to `delta` (the matmul before: o, or the
    /// previous layer's down); then `res_out = res + delta`, `h = rmsnorm(res_out) * nw` as
    /// `add_rmsnorm` rounds them; `shrink` (`(a, y)`: `a` `[slots, pr, K]`, f32 `y` of at least
    /// `T * pr`) writes `y[t] = a[s] · h[t]`. Tokens on no adapter get the plain norm.
    /// `res_out` must not be `res`.
    pub fn lora_norm_shrink_into(
        &self,
        (res, delta, res_out): (&Tensor, Option<&Tensor>, &Tensor),
        (nw, eps): (&Tensor, f64),
        expand: Option<(&Tensor, usize, &Tensor)>,
        h: &Tensor,
        shrink: Option<(&Tensor, &Tensor)>,
        tiles: &Tensor,
    ) -> Result<()> {
        let f = self
            .lora_fused
            .as_ref()
            .ok_or_else(|| kernel_err("lora norm", "the fused LoRA kernels are not loaded"))?;
        for x in [res, res_out, nw, h] {
            self.check_dtype(x)?;
        }
        let k = res.dim(candle_core::D::Minus1)?;
        let t = res.elem_count() / k.max(1);
        let ntiles = tiles.elem_count() / 3;
        let mut fits = [res_out, h].iter().all(|x| x.elem_count() == t * k)
            && nw.elem_count() == k
            && delta.is_none_or(|d| d.elem_count() == t * k)
            && k.is_multiple_of(8)
            && k <= LORA_FUSED_MAX_HIDDEN
            && tiles.dtype() == DType::U32;
        // Without an expand, r stays 0 and the rank-16 kernel runs.
        let (mut slots, mut r, mut parts) = (0, 0, 0);
        if let Some((y, p, b)) = expand {
            self.check_dtype(b)?;
            let (s, kb, rb) = b.dims3()?;
            (slots, r, parts) = (s, rb, p);
            fits &= kb == k
                && rb.is_multiple_of(8)
                && rb <= LORA_FUSED_MAX_RANK
                && y.dtype() == DType::F32
                && y.elem_count() >= t * p * rb
                && delta.is_some();
        }
        let mut pr = 0;
        if let Some((a, y)) = shrink {
            self.check_dtype(a)?;
            let (s, p, ka) = a.dims3()?;
            fits &= ka == k && y.dtype() == DType::F32 && y.elem_count() >= t * p;
            fits &= expand.is_none() || s == slots;
            (slots, pr) = (s, p);
        }
        if !fits {
            return Err(kernel_err("lora norm", "shapes do not fit"));
        }
        if t == 0 {
            return Ok(());
        }
        let (pres, pro, pnw, ph, pt) = (
            self.ptr(res)?,
            self.ptr(res_out)?,
            self.ptr(nw)?,
            self.ptr(h)?,
            self.ptr(tiles)?,
        );
        let (pd, add) = match delta {
            Some(d) => (self.ptr(d)?, 1i32),
            None => (pres, 0i32),
        };
        if add == 1 && pro == pres {
            return Err(kernel_err("lora norm", "res_out aliases res"));
        }
        let (pyin, pb) = match expand {
            Some((y, _, b)) => (self.ptr(y)?, self.ptr(b)?),
            None => (0u64, 0u64),
        };
        let (pa, pyout) = match shrink {
            Some((a, y)) => (self.ptr(a)?, self.ptr(y)?),
            None => (0u64, 0u64),
        };
        let eps32 = eps as f32;
        let ints = [parts, pr, ntiles, slots, k, r].map(|v| v as i32);
        let [parts32, pr32, nt32, slots32, k32, r32] = ints;
        let cfg = LaunchConfig {
            grid_dim: (pr.div_ceil(NS_ROWS).max(1) as u32, t as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: (r * 4) as u32,
        };
        let mut l = self.launcher(&f[usize::from(r > 16)][0]);
        l.arg(&pres).arg(&pd).arg(&pro).arg(&pnw).arg(&eps32).arg(&add);
        l.arg(&pyin).arg(&parts32).arg(&pb).arg(&ph).arg(&pa).arg(&pyout);
        l.arg(&pr32).arg(&pt).arg(&nt32).arg(&slots32).arg(&k32).arg(&r32);
        // SAFETY: argument types match `lora_norm_shrink_*`; shapes are checked above and the
        // null pointers of an absent expand or shrink are never read (`bin`, `pr` 0).
        unsafe { l.launch(cfg) }.w()?;
        Ok(())
    }

    /// The gate|up delta of a LoRA decode step expanded into `gu` (`[T, 2n]`, from `y`
    /// `[T, 2r]` and `b` `[slots, 2n, r]`), `act = silu(gate) * up` (`[T, n]`), and the down
    /// shrink's partial sums `yd[t, block, j]` over each [`LORA_SILU_COLS`] columns of `act`
    /// (`a`: down's `[slots, r, n]`; f32 `yd` of at least `T * ceil(n / 256) * r`), for the
    /// tokens of the one-token `tiles`; tokens on no adapter get the plain product.
    pub fn lora_silu_shrink_into(
        &self,
        gu: &Tensor,
        (y, b): (&Tensor, &Tensor),
        act: &Tensor,
        (a, yd): (&Tensor, &Tensor),
        tiles: &Tensor,
    ) -> Result<()> {
        let f = self
            .lora_fused
            .as_ref()
            .ok_or_else(|| kernel_err("lora silu", "the fused LoRA kernels are not loaded"))?;
        for x in [gu, b, act, a] {
            self.check_dtype(x)?;
        }
        let n = act.dim(candle_core::D::Minus1)?;
        let t = act.elem_count() / n.max(1);
        let (slots, n2, r) = b.dims3()?;
        let np = n.div_ceil(LORA_SILU_COLS);
        let fits = gu.elem_count() == t * 2 * n
            && n2 == 2 * n
            && a.dims3()? == (slots, r, n)
            && r.is_multiple_of(8)
            && r <= LORA_FUSED_MAX_RANK
            && [y, yd].iter().all(|v| v.dtype() == DType::F32)
            && y.elem_count() >= t * 2 * r
            && yd.elem_count() >= t * np * r
            && tiles.dtype() == DType::U32;
        if !fits {
            return Err(kernel_err("lora silu", "shapes do not fit"));
        }
        if t == 0 {
            return Ok(());
        }
        let ptrs = [gu, y, b, act, a, yd, tiles].map(|x| self.ptr(x));
        let [pgu, py, pb, pact, pa, pyd, pt] = ptrs;
        let (pgu, py, pb, pact, pa, pyd, pt) = (pgu?, py?, pb?, pact?, pa?, pyd?, pt?);
        let ints = [tiles.elem_count() / 3, slots, n, r].map(|v| v as i32);
        let [nt32, slots32, n32, r32] = ints;
        let cfg = LaunchConfig {
            grid_dim: (np as u32, t as u32, 1),
            block_dim: (LORA_SILU_COLS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.launcher(&f[usize::from(r > 16)][1]);
        l.arg(&pgu).arg(&py).arg(&pb).arg(&pact).arg(&pa).arg(&pyd);
        l.arg(&pt).arg(&nt32).arg(&slots32).arg(&n32).arg(&r32);
        // SAFETY: argument types match `lora_silu_shrink_*`; shapes are checked above.
        unsafe { l.launch(cfg) }.w()?;
        Ok(())
    }
}
