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
