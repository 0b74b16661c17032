//! The skinny matmuls of decode steps (`kernels/gemv.cu`): CUDA-core kernels for 1-2 rows and
//! tensor-core kernels for 3-8, plain, with SiLU*up, and behind the fused add+RMSNorm, with
//! the L2 prefetch of a next weight on, against f32 math on the same bf16 inputs. Shapes of
//! Qwen3-0.6B/1.7B layers plus ragged ones (output rows not a multiple of a block's 16).

use super::*;

pub(super) fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    for warp_norm in [false, true] {
        let opts = LaunchOptions {
            gemv_mma: true,
            l2_prefetch: true,
            warp_norm,
            ..LaunchOptions::default()
        };
        let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
        check_with(&k, if warp_norm { " (warp norm)" } else { "" }, dev, t)?;
    }
    Ok(())
}

fn check_with(k: &CudaKernels, tag: &str, dev: &Device, t: &mut Table) -> Res<()> {
    let dt = DType::BF16;
    let f = |x: &Tensor| x.to_dtype(DType::F32);
    let matmul = |x: &Tensor, w: &Tensor| -> Res<Tensor> { Ok(f(x)?.matmul(&f(w)?.t()?)?) };
    let next = randn(&[1000, 1024], dt, dev)?;
    for rows in 1..=8usize {
        for &(n, kk) in &[
            (4096usize, 1024usize),
            (1024, 2048),
            (1000, 96),
            (2048, 6144),
        ] {
            let x = randn(&[rows, kk], dt, dev)?;
            let w = (randn(&[n, kk], dt, dev)? * 0.05)?.to_dtype(dt)?;
            let out = Tensor::zeros((rows, n), dt, dev)?;
            k.linear_next_into(&x, &w, &out, Some(&next))?;
            t.check(
                format!("gemv rows {rows} n {n} k {kk}{tag}"),
                rel(&out, &matmul(&x, &w)?)?,
                2e-2,
            );
            // gate|up with SiLU*up: w is [2I, K] with I = n / 2.
            let i = n / 2;
            let act = Tensor::zeros((rows, i), dt, dev)?;
            let gu = Tensor::zeros((rows, n), dt, dev)?;
            k.gate_up_silu_into(&x, &w, &gu, &act)?;
            let full = matmul(&x, &w)?;
            let reference =
                (candle_nn::ops::silu(&full.narrow(1, 0, i)?)? * full.narrow(1, i, i)?)?;
            t.check(
                format!("gemv_silu rows {rows} I {i} k {kk}{tag}"),
                rel(&act, &reference)?,
                2e-2,
            );
            if kk > 4096 {
                continue;
            }
            // Behind the fused norm: h = rmsnorm(bf16(res + delta)) * nw, then the matmul.
            let res = randn(&[rows, kk], dt, dev)?;
            let delta = randn(&[rows, kk], dt, dev)?;
            let nw = randn(&[kk], dt, dev)?.affine(0.1, 1.0)?.to_dtype(dt)?;
            let h = Tensor::zeros((rows, kk), dt, dev)?;
            let sum = (&res + &delta)?;
            let normed = candle_nn::ops::rms_norm(&f(&sum)?, &f(&nw)?, 1e-6)?.to_dtype(dt)?;
            for silu in [false, true] {
                // Fresh each run: a kernel that skipped the write would fail the sum check.
                let res_out = Tensor::zeros((rows, kk), dt, dev)?;
                let dst = if silu { &act } else { &out };
                k.norm_linear_into(
                    (&res, Some(&delta), &res_out),
                    (&nw, 1e-6),
                    &h,
                    &w,
                    &out,
                    silu.then_some((&gu, &act)),
                    Some(&next),
                )?;
                let full = matmul(&normed, &w)?;
                let reference = if silu {
                    (candle_nn::ops::silu(&full.narrow(1, 0, i)?)? * full.narrow(1, i, i)?)?
                } else {
                    full
                };
                t.check(
                    format!(
                        "norm_gemv{} rows {rows} n {n} k {kk}",
                        if silu { "_silu" } else { "" }
                    ),
                    rel(dst, &reference)?,
                    2e-2,
                );
                t.check(
                    format!("norm_gemv rows {rows} k {kk} (residual sum)"),
                    rel(&res_out, &sum)?,
                    1e-2,
                );
            }
        }
    }
    Ok(())
}
