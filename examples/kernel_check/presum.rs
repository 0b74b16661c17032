//! The presummed norm of 3-8-row decode steps (`LaunchOptions::norm_presum`,
//! `kernels/gemv_mma.cu` `mma_gemv_res_*`, `mma_gemv_pre_*`) against the path it replaces:
//! the plain tensor-core matmul, the add+RMSNorm launch, then the plain or SiLU matmul. The
//! matmul's output and the residual's sum bit for bit (a sum rounded otherwise, or written
//! to the wrong row, fails them); the matmul after the norm, which rounds its input at
//! another scale (bf16(h * w), then 1 / rms on the dot products), against f32 math on the
//! residual's sum, as the path it replaces: on average within 6e-3 of the outputs' mean size
//! (bf16's rounding of the input and the output alone gives 2.7-4.3e-3 over random draws in
//! a model of both paths; one of 66 column blocks' partial sums left out moves every
//! output by ~0.8%, the norm weight left out by far more) and nowhere by more than 1e-2 of
//! the largest output (rounding alone reached 5.1e-3 there on one draw: BENCHMARKS.md round
//! 58).

use super::*;

pub(super) fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let set = |o: LaunchOptions| -> Res<CudaKernels> {
        Ok(CudaKernels::new(dev, DType::BF16, &o)?.ok_or("no kernels")?)
    };
    let base = set(LaunchOptions {
        norm_presum: false,
        ..LaunchOptions::default()
    })?;
    let k = set(LaunchOptions::default())?;
    // The input (and the norm weight) loaded step by step in the loop (`gemv_mma_x_stage`
    // off, the `gemv_mma_ef` build): the same bits as `k`, which stages it, in every output.
    let unstaged = set(LaunchOptions {
        gemv_mma_x_stage: false,
        ..LaunchOptions::default()
    })?;
    if !k.gemv_mma_x_stage() || unstaged.gemv_mma_x_stage() {
        return Err("the presum check's kernel sets are not the staged and unstaged builds".into());
    }
    let dt = DType::BF16;
    let zeros = |r: usize, c: usize| Tensor::zeros((r, c), dt, dev);
    // (hidden, producer inputs, consumer rows, SiLU): 0.6B's o -> gate|up and down -> qkv,
    // and a ragged shape (66 column blocks; 1,000 consumer rows, not a multiple of 16).
    let shapes = [
        (1024usize, 2048usize, 6144usize, true),
        (1024, 3072, 4096, false),
        (1056, 1024, 1000, false),
        (1056, 1024, 2000, true),
    ];
    for rows in 3..=8usize {
        for &(hidden, kp, nc, silu) in &shapes {
            let wp = (randn(&[hidden, kp], dt, dev)? * 0.03)?.to_dtype(dt)?;
            let wc = (randn(&[nc, hidden], dt, dev)? * 0.03)?.to_dtype(dt)?;
            let x = randn(&[rows, kp], dt, dev)?;
            let res = randn(&[rows, hidden], dt, dev)?;
            let nw = randn(&[hidden], dt, dev)?.affine(0.1, 1.0)?.to_dtype(dt)?;
            if !k.presum_serves(rows, &wp, &wc) || base.presum_serves(rows, &wp, &wc) {
                return Err(format!("presum_serves wrong at {rows} rows, hidden {hidden}").into());
            }
            let n_out = if silu { nc / 2 } else { nc };
            // The path it replaces.
            let (o1, r1, h1, y1) = (
                zeros(rows, hidden)?,
                zeros(rows, hidden)?,
                zeros(rows, hidden)?,
                zeros(rows, n_out)?,
            );
            base.linear_into(&x, &wp, &o1)?;
            base.add_rmsnorm_to(Some(&o1), &res, &r1, &nw, 1e-6, &h1)?;
            let gu = zeros(rows, nc)?;
            if silu {
                base.gate_up_silu_into(&h1, &wc, &gu, &y1)?;
            } else {
                base.linear_into(&h1, &wc, &y1)?;
            }
            // The presummed norm.
            let (o2, r2, y2) = (
                zeros(rows, hidden)?,
                zeros(rows, hidden)?,
                zeros(rows, n_out)?,
            );
            let ss = Tensor::zeros(
                policy_serve::engine::cuda::presum_len(hidden),
                DType::F32,
                dev,
            )?;
            k.linear_res_into(&x, &wp, &o2, (&res, &r2), &ss)?;
            let act = silu.then_some(&y2);
            let out = if silu { &gu } else { &y2 };
            k.presum_linear_into(&r2, (&nw, 1e-6), &ss, &wc, out, act)?;
            let what = format!(
                "presum rows {rows} hidden {hidden} k {kp} -> {nc}{}",
                if silu { " silu" } else { "" }
            );
            // The unstaged build on the same inputs, bit for bit against `k`'s.
            let (o3, r3, y3) = (
                zeros(rows, hidden)?,
                zeros(rows, hidden)?,
                zeros(rows, n_out)?,
            );
            let ss3 = ss.zeros_like()?;
            unstaged.linear_res_into(&x, &wp, &o3, (&res, &r3), &ss3)?;
            let gu3 = zeros(rows, nc)?;
            let (out3, act3) = if silu { (&gu3, Some(&y3)) } else { (&y3, None) };
            unstaged.presum_linear_into(&r3, (&nw, 1e-6), &ss3, &wc, out3, act3)?;
            for (a, b, part) in [(&o3, &o2, "matmul before"), (&r3, &r2, "residual sum")] {
                t.check(format!("{what}: {part} (unstaged)"), rel(a, b)?, 0.0);
            }
            t.check(
                format!("{what}: matmul after (unstaged)"),
                rel(&y3, &y2)?,
                0.0,
            );
            t.check(format!("{what}: matmul before"), rel(&o2, &o1)?, 0.0);
            t.check(format!("{what}: residual sum"), rel(&r2, &r1)?, 0.0);
            let reference = normed_matmul(&r1, &nw, &wc, silu)?;
            for (y, path) in [(&y2, "matmul after"), (&y1, "(norm launch)")] {
                t.check(format!("{what}: {path}"), rel(y, &reference)?, 1e-2);
                t.check(
                    format!("{what}: {path}, mean"),
                    rel_mean(y, &reference)?,
                    6e-3,
                );
            }
        }
    }
    Ok(())
}

/// f32 math on bf16 inputs: rmsnorm(h) * w (eps 1e-6), times `wc`ᵀ; with `silu`, silu(gate) *
/// up of the two halves of the result.
fn normed_matmul(h: &Tensor, nw: &Tensor, wc: &Tensor, silu: bool) -> Res<Tensor> {
    let f = DType::F32;
    let h = h.to_dtype(f)?;
    let inv = (h.sqr()?.mean_keepdim(1)? + 1e-6)?.sqrt()?.recip()?;
    let normed = h.broadcast_mul(&inv)?.broadcast_mul(&nw.to_dtype(f)?)?;
    let y = normed.matmul(&wc.to_dtype(f)?.t()?)?;
    if !silu {
        return Ok(y);
    }
    let i = y.dim(1)? / 2;
    let (gate, up) = (y.narrow(1, 0, i)?, y.narrow(1, i, i)?);
    let sig = (gate.neg()?.exp()? + 1.0)?.recip()?;
    Ok(((gate * sig)? * up)?)
}

/// The mean |a - b| over the mean |b| (rounding spread over every output stays small; an
/// error that moves every output does not).
fn rel_mean(a: &Tensor, b: &Tensor) -> Res<f32> {
    let a = a.to_dtype(DType::F32)?.flatten_all()?;
    let b = b.to_dtype(DType::F32)?.flatten_all()?;
    let d = (a - &b)?.abs()?.mean(0)?.to_scalar::<f32>()?;
    let s = b.abs()?.mean(0)?.to_scalar::<f32>()?;
    Ok(d / s.max(1e-6))
}
