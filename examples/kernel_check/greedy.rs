//! The greedy tokens computed with the f32 logits (`LaunchOptions::graph_argmax`,
//! `kernels/layer_ops.cu` `to_f32_argmax_*`) against the path it replaces, `to_f32` then
//! `argmax`: the f32 logits bit for bit and the same token in every row, on random bf16 rows
//! of a vocabulary (whose maxima often tie), rows of one repeated value (ties to index 0), a
//! row whose largest value sits at its last index and once more earlier, a row of -inf and
//! NaN (token 0), at 1-64 rows and a row too short to split; each launched twice (the row
//! counters the last block resets), the second time with a feed (`LaunchOptions::graph_feed`:
//! a decode graph's input ids), which must get the same tokens.

use super::*;

pub(super) fn checks(dev: &Device, dt: DType, t: &mut Table) -> Res<()> {
    let opts = LaunchOptions {
        graph_argmax: true,
        ..LaunchOptions::default()
    };
    let k = CudaKernels::new(dev, dt, &opts)?.ok_or("no kernels")?;
    for &(rows, n) in &[
        (1usize, 151_936usize),
        (4, 151_936),
        (64, 151_936),
        (8, 1000),
        (2, 151_937),
    ] {
        let mut host: Vec<f32> = Tensor::randn(0f32, 3.0, (rows, n), dev)?
            .flatten_all()?
            .to_vec1()?;
        if rows >= 4 {
            host[..n].fill(0.5);
            let r = &mut host[n..2 * n];
            r[n - 1] = 100.0;
            r[n / 3] = 100.0;
            host[2 * n..3 * n].fill(f32::NEG_INFINITY);
            host[2 * n + 7] = f32::NAN;
        }
        let x = Tensor::from_vec(host, (rows, n), dev)?.to_dtype(dt)?;
        let o1 = Tensor::zeros((rows, n), DType::F32, dev)?;
        k.to_f32_into(&x, &o1)?;
        let want: Vec<u32> = k.argmax(&o1)?.to_vec1()?;
        let scratch = k.greedy_scratch(rows, n)?;
        for launch in 1..=2 {
            let o2 = Tensor::zeros((rows, n), DType::F32, dev)?;
            let ids = Tensor::zeros(rows, DType::U32, dev)?;
            // The feed starts as a sentinel no row's token is.
            let feed = (launch == 2)
                .then(|| Tensor::from_vec(vec![u32::MAX; rows], rows, dev))
                .transpose()?;
            k.to_f32_argmax_into(&x, &o2, (&ids, feed.as_ref()), &scratch)?;
            let got: Vec<u32> = ids.to_vec1()?;
            let wrong = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            let what = format!("to_f32_argmax {dt:?} rows {rows} x {n}, launch {launch}");
            t.check(format!("{what}: logits"), rel(&o2, &o1)?, 0.0);
            t.check(format!("{what}: tokens (rows wrong)"), wrong as f32, 0.0);
            if let Some(f) = feed {
                let fed: Vec<u32> = f.to_vec1()?;
                let wrong = fed.iter().zip(&want).filter(|(a, b)| a != b).count();
                t.check(
                    format!("{what}: fed tokens (rows wrong)"),
                    wrong as f32,
                    0.0,
                );
            }
        }
    }
    Ok(())
}

/// The lm_head of 1-row steps on the streamed kernel (`LaunchOptions::gemv_tma_head`, sm_90)
/// and its one-launch head (`gemv_tma_head_argmax`): the head's logits within bf16 rounding of
/// cuBLAS's (the default path; different sums), and the one launch's f32 logits bit for bit
/// and its token equal to that lm_head then `to_f32` and `argmax`, at 0.6B's and 1.7B's
/// shapes and one past the skinny matmuls' widest, at 2 and 10 pieces a warp; one weight has
/// its two largest rows equal (a tie: the lower index wins; a merge that kept the later
/// block's or warp's pick fails it), each launched twice (the counter the last block resets),
/// the second time with a feed. On a GPU without sm_90 nothing is checked (printed).
pub(super) fn head_checks(dev: &Device, t: &mut Table) -> Res<()> {
    let dt = DType::BF16;
    let cublas_head = LaunchOptions {
        gemv_tma_head: None,
        ..LaunchOptions::default()
    };
    let blas = CudaKernels::new(dev, dt, &cublas_head)?.ok_or("no kernels")?;
    for ns in [2u8, 10] {
        let opts = LaunchOptions {
            graph_argmax: true,
            gemv_tma_head: Some(ns),
            gemv_tma_head_argmax: true,
            ..LaunchOptions::default()
        };
        let k = CudaKernels::new(dev, dt, &opts)?.ok_or("no kernels")?;
        for &(n, kk, tie) in &[
            (151_936usize, 1024usize, false),
            (151_936, 2048, true),
            (40_000, 1024, true),
        ] {
            let x = randn(&[1, kk], dt, dev)?;
            let mut w = (randn(&[n, kk], dt, dev)? * 0.05)?.to_dtype(dt)?;
            if tie {
                // Rows 7,001 and n - 3 (in other warps and blocks): x's signs, the largest
                // dot product by far, and equal.
                let top = x
                    .ge(0.0)?
                    .to_dtype(DType::F32)?
                    .affine(2.0, -1.0)?
                    .to_dtype(dt)?;
                for r in [7001, n - 3] {
                    w = w.slice_assign(&[r..r + 1, 0..kk], &top)?;
                }
            }
            let what = format!("lm_head streamed {ns} pieces, {n} x {kk}");
            let act = Tensor::zeros((1, n), dt, dev)?;
            let cublas = Tensor::zeros((1, n), dt, dev)?;
            k.linear_into(&x, &w, &act)?;
            blas.linear_into(&x, &w, &cublas)?;
            t.check(format!("{what}: against cuBLAS"), rel(&act, &cublas)?, 1e-2);
            let want_logits = Tensor::zeros((1, n), DType::F32, dev)?;
            k.to_f32_into(&act, &want_logits)?;
            let want: Vec<u32> = k.argmax(&want_logits)?.to_vec1()?;
            if tie {
                t.holds(
                    format!("{what}: the tie's lower row is the argmax"),
                    want == [7001],
                );
            }
            let scratch = k.greedy_scratch(1, n)?;
            for launch in 1..=2 {
                let logits = Tensor::zeros((1, n), DType::F32, dev)?;
                let ids = Tensor::zeros(1, DType::U32, dev)?;
                let feed = (launch == 2)
                    .then(|| Tensor::from_vec(vec![u32::MAX], 1, dev))
                    .transpose()?;
                let ran =
                    k.lm_head_argmax_into(&x, &w, &logits, (&ids, feed.as_ref()), &scratch)?;
                if !ran {
                    println!("{what}: not served (no sm_90): not checked");
                    return Ok(());
                }
                let what = format!("{what}, one launch, launch {launch}");
                t.check(format!("{what}: logits"), rel(&logits, &want_logits)?, 0.0);
                t.holds(format!("{what}: token"), ids.to_vec1::<u32>()? == want);
                if let Some(f) = feed {
                    t.holds(format!("{what}: fed token"), f.to_vec1::<u32>()? == want);
                }
            }
        }
    }
    Ok(())
}
