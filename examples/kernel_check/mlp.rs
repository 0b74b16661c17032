//! The fused MLP of 1-2-row decode steps (`LaunchOptions::mlp_fused`, `kernels/mlp_fused.cu`)
//! and the norm + matmul that sums its partials (`pnorm_gemv_*`), against the three launches
//! they replace (the norm + gate|up + SiLU kernel, down, the next norm + qkv) on Qwen3-0.6B's
//! shape:
//! - the residual's sum (res + o) bit for bit (block 0 writing another row, or the add
//!   rounded otherwise, fails it);
//! - the partials summed on the host against f32 math on the replaced path's SiLU product
//!   within 1e-4 (f32 order only: one SiLU product off by a bf16 ulp, a block's channels
//!   shifted, or a cluster rank's rows left out, moves it by far more);
//! - the next residual (res + o + down, each rounded to bf16) within one bf16 rounding of
//!   the replaced path's (8e-3), and the next matmul against f32 math on it within 5e-3, as
//!   the replaced path's (a partial left out of the sum moves both by far more).

use super::*;

pub(super) fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let dt = DType::BF16;
    let base = CudaKernels::new(dev, dt, &LaunchOptions::default())?.ok_or("no kernels")?;
    let (hidden, inter, n_next) = (1024usize, 3072usize, 4096usize);
    let w = |r: usize, c: usize| -> Res<Tensor> {
        Ok((randn(&[r, c], dt, dev)? * (1.0 / (c as f64).sqrt()))?.to_dtype(dt)?)
    };
    let (gu, down, qkv) = (w(2 * inter, hidden)?, w(hidden, inter)?, w(n_next, hidden)?);
    let nw = randn(&[hidden], dt, dev)?.affine(0.1, 1.0)?.to_dtype(dt)?;
    let nw2 = randn(&[hidden], dt, dev)?.affine(0.1, 1.0)?.to_dtype(dt)?;
    let zeros = |r: usize, c: usize| Tensor::zeros((r, c), dt, dev);
    let k = CudaKernels::new(
        dev,
        dt,
        &LaunchOptions {
            mlp_fused: true,
            ..LaunchOptions::default()
        },
    )?
    .ok_or("no kernels")?;
    for rows in 1..=3usize {
        let serves = k.mlp_fused_serves(rows, &gu, &down, &qkv);
        if serves != (rows <= 2) || base.mlp_fused_serves(rows, &gu, &down, &qkv) {
            return Err(format!("mlp_fused_serves wrong at {rows} rows").into());
        }
    }
    for rows in 1..=2usize {
        let res = randn(&[rows, hidden], dt, dev)?;
        let o = (randn(&[rows, hidden], dt, dev)? * 0.5)?.to_dtype(dt)?;
        // The launches it replaces.
        let (r1, h, act) = (
            zeros(rows, hidden)?,
            zeros(rows, hidden)?,
            zeros(rows, inter)?,
        );
        let (gu_buf, d1, r1b, y1) = (
            zeros(rows, 2 * inter)?,
            zeros(rows, hidden)?,
            zeros(rows, hidden)?,
            zeros(rows, n_next)?,
        );
        let nwe = (&nw, 1e-6);
        base.norm_linear_into(
            (&res, Some(&o), &r1),
            nwe,
            &h,
            &gu,
            &gu_buf,
            Some((&gu_buf, &act)),
            None,
        )?;
        base.linear_into(&act, &down, &d1)?;
        base.norm_linear_into(
            (&r1, Some(&d1), &r1b),
            (&nw2, 1e-6),
            &h,
            &qkv,
            &y1,
            None,
            None,
        )?;
        // The fused MLP, then the norm + matmul on its partials.
        let np = policy_serve::engine::cuda::MLP_PARTS;
        let parts = Tensor::zeros((rows, np, hidden), DType::F32, dev)?;
        let (r2, r2b, y2) = (
            zeros(rows, hidden)?,
            zeros(rows, hidden)?,
            zeros(rows, n_next)?,
        );
        k.mlp_fused_into((&res, &o, &r2), nwe, &gu, &down, &parts)?;
        k.norm_linear_into(
            (&r2, Some(&parts), &r2b),
            (&nw2, 1e-6),
            &h,
            &qkv,
            &y2,
            None,
            None,
        )?;
        let what = format!("mlp fused rows {rows}");
        t.check(format!("{what}: residual sum"), rel(&r2, &r1)?, 0.0);
        let f = DType::F32;
        let down_ref = act.to_dtype(f)?.matmul(&down.to_dtype(f)?.t()?)?;
        t.check(
            format!("{what}: down (partials summed)"),
            rel(&parts.sum(1)?, &down_ref)?,
            1e-4,
        );
        t.check(format!("{what}: next residual"), rel(&r2b, &r1b)?, 8e-3);
        let reference = super::presum::normed_matmul(&r2b, &nw2, &qkv, false)?;
        t.check(format!("{what}: next matmul"), rel(&y2, &reference)?, 5e-3);
        let reference = super::presum::normed_matmul(&r1b, &nw2, &qkv, false)?;
        t.check(
            format!("{what}: (three launches)"),
            rel(&y1, &reference)?,
            5e-3,
        );
    }
    Ok(())
}
