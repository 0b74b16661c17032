//! LoRA steps of up to 64 rows whose shrinks are extra output columns of the base matmuls
//! (`LaunchOptions::lora_wide`; the weights' layout: `model::lora_slots`): the matmul of a
//! step's rows against `[out + slots·P·r, in]` writes `wide` `[T, out + slots·P·r]`, the base
//! output then every slot's `y` (rounded to the compute dtype). These launchers read it at
//! strides: the qkv delta into the compact qkv output (`lora_wide_expand`), the gate|up delta
//! with the SiLU product, and the o/down deltas with the add+RMSNorm after them
//! (`kernels/lora_silu.cu`, the `_w` kernels).
//!
//! Invariant: a token reads only its own slot's `P·r` columns of its row; tokens on no adapter
//! get the base output unchanged, so the launches cover every row of the step.

use candle_core::Tensor;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, LaunchConfig};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use super::lora_overlap::{YAt, rank_fits};
use crate::error::Result;

impl CudaKernels {
    /// Whether the wide-matmul LoRA kernels are loaded (`LaunchOptions::lora_wide`).
    pub fn lora_wide(&self) -> bool {
        self.lora_overlap.as_ref().is_some_and(|o| o.wide.is_some())
    }

    /// Whether a LoRA step of `rows` rows takes the wide kernels (`LaunchOptions::lora_wide`).
    pub fn lora_wide_serves(&self, rows: usize) -> bool {
        self.lora_overlap
            .as_ref()
            .is_some_and(|o| o.wide.is_some() && rows >= o.wide_min_rows)
    }

    /// The wide kernels (silu, norm, expand), or an error naming `what`.
    fn wide_kernels(&self, what: &str) -> Result<&[[CudaFunction; 2]; 3]> {
        self.overlap_kernels(what)?
            .wide
            .as_ref()
            .ok_or_else(|| kernel_err(what, "the wide LoRA kernels are not loaded"))
    }

    /// `wide`'s rows, its row stride and the address of column `col` of row 0, after checking
    /// that it holds `t` rows, `n` base columns and `slots · pr` shrink columns.
    fn wide_at(
        &self,
        wide: &Tensor,
        t: usize,
        (n, slots, pr): (usize, usize, usize),
    ) -> Result<(u64, usize)> {
        self.check_dtype(wide)?;
        let (tw, ld) = wide.dims2()?;
        if tw != t || ld < n + slots * pr {
            return Err(kernel_err(
                "lora wide",
                format!(
                    "a wide output {:?} for {t} rows of {n} + {slots} x {pr} columns",
                    wide.shape()
                ),
            ));
        }
        Ok((self.ptr(wide)?, ld))
    }

    /// `out` (`[T, n]`) = the base output in `wide`'s first `n` columns plus, for each token
    /// of the one-token `tiles` on slot `s`, `b[s] · y` (its projection's `r` values of slot
    /// `s`'s shrink columns; `b` `[slots, n, r]`, `splits` the projections' first rows and `n`),
    /// rounded as the expand rounds it; tokens on no adapter copy the base output.
    pub fn lora_wide_expand_into(
        &self,
        wide: &Tensor,
        (b, splits): (&Tensor, &[usize]),
        out: &Tensor,
        tiles: &Tensor,
    ) -> Result<()> {
        let fs = self.wide_kernels("lora wide expand")?;
        for x in [b, out] {
            self.check_dtype(x)?;
        }
        let (slots, n, r) = b.dims3()?;
        let parts = splits.len().saturating_sub(1);
        let t = out.elem_count() / n.max(1);
        let fits = (1..=3).contains(&parts)
            && splits.last() == Some(&n)
            && out.elem_count() == t * n
            && rank_fits(r, tiles);
        if !fits {
            return Err(kernel_err("lora wide expand", "shapes do not fit"));
        }
        let (pw, ld) = self.wide_at(wide, t, (n, slots, parts * r))?;
        if t == 0 {
            return Ok(());
        }
        let split = |i: usize| if i < parts { splits[i] } else { n };
        let [ld32, nt32, slots32, n32, r32, pr32, s1, s2] = [
            ld,
            tiles.elem_count() / 3,
            slots,
            n,
            r,
            parts * r,
            split(1),
            split(2),
        ]
        .map(|v| v as i32);
        let (pb, po, pt) = (self.ptr(b)?, self.ptr(out)?, self.ptr(tiles)?);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256) as u32, t as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.launcher(&fs[2][usize::from(r > 16)]);
        l.arg(&pw).arg(&ld32).arg(&pb).arg(&po).arg(&pt).arg(&nt32);
        l.arg(&slots32)
            .arg(&n32)
            .arg(&r32)
            .arg(&pr32)
            .arg(&s1)
            .arg(&s2);
        // SAFETY: argument types match `lora_wide_expand_*`; shapes are checked above.
        unsafe { l.launch(cfg) }.w()?;
        Ok(())
    }

    /// [`CudaKernels::lora_expand_silu_into`] on the wide gate|up output: `act` (`[T, n]`) =
    /// `silu(gate) * up` of `wide`'s first `2n` columns, each token on a slot with its delta
    /// from its slot's `2r` shrink columns (`b` `[slots, 2n, r]`).
    pub fn lora_expand_silu_wide_into(
        &self,
        wide: &Tensor,
        b: &Tensor,
        act: &Tensor,
        tiles: &Tensor,
    ) -> Result<()> {
        let fs = self.wide_kernels("lora wide silu")?;
        for x in [b, act] {
            self.check_dtype(x)?;
        }
        let n = act.dim(candle_core::D::Minus1)?;
        let t = act.elem_count() / n.max(1);
        let (slots, n2, r) = b.dims3()?;
        let fits = n2 == 2 * n && rank_fits(r, tiles);
        if !fits {
            return Err(kernel_err("lora wide silu", "shapes do not fit"));
        }
        let (pw, ld) = self.wide_at(wide, t, (2 * n, slots, 2 * r))?;
        if t == 0 {
            return Ok(());
        }
        let y_at = YAt {
            ptr: pw + (2 * n * self.dtype.size_in_bytes()) as u64,
            ld,
            slot: 2 * r,
        };
        self.silu_launch(
            &fs[0][usize::from(r > 16)],
            (pw, ld),
            y_at,
            (b, act, tiles),
            t,
        )
    }

    /// [`CudaKernels::lora_add_rmsnorm_into`] with the delta and its shrink in `wide` (the o or
    /// down output: `n` base columns, then each slot's `r` shrink columns).
    pub fn lora_add_rmsnorm_wide_into(
        &self,
        (wide, res, res_out): (&Tensor, &Tensor, &Tensor),
        (w, eps): (&Tensor, f64),
        h: &Tensor,
        b: &Tensor,
        tiles: &Tensor,
    ) -> Result<()> {
        let fs = self.wide_kernels("lora wide norm")?;
        for x in [res, res_out, w, h, b] {
            self.check_dtype(x)?;
        }
        let n = res.dim(candle_core::D::Minus1)?;
        let t = res.elem_count() / n.max(1);
        let (slots, nb, r) = b.dims3()?;
        let fits = [res_out, h].iter().all(|x| x.elem_count() == t * n)
            && w.elem_count() == n
            && nb == n
            && rank_fits(r, tiles);
        if !fits {
            return Err(kernel_err("lora wide norm", "shapes do not fit"));
        }
        let (pw, ld) = self.wide_at(wide, t, (n, slots, r))?;
        if t == 0 {
            return Ok(());
        }
        let y_at = YAt {
            ptr: pw + (n * self.dtype.size_in_bytes()) as u64,
            ld,
            slot: r,
        };
        let f = &fs[1][usize::from(r > 16)];
        self.norm_launch(f, ((pw, ld), res, res_out), (w, eps), h, (y_at, b), tiles)
    }
}
