//! The greedy tokens computed with the f32 logits (`LaunchOptions::graph_argmax`,
//! `kernels/layer_ops.cu` `to_f32_argmax_*`) against the path it replaces, `to_f32` then
//! `argmax`: the f32 logits bit for bit and the same token in every row, on random bf16 rows
//! of a vocabulary (whose maxima often tie), rows of one repeated value (ties to index 0), a
//! row whose largest value sits at its last index and once more earlier, a row of -inf and
//! NaN (token 0), at 1-64 rows and a row too short to split; each launched twice (the row
//! counters the last block resets), the second time with a feed (`LaunchOptions::graph_feed`:
//! a decode graph's input ids), which must get the same tokens; then once more with a whole
//! input layout as the feed, moved on (`LaunchOptions::graph_advance`), which must equal the
//! host's `advance_decode_rows` word for word (padding, verify, in-block and past-the-table
//! rows).

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
            k.to_f32_argmax_into(&x, &o2, (&ids, feed.as_ref().map(|f| (f, 0))), &scratch)?;
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
        advanced(&k, (&x, &want, &scratch), dev, t)?;
    }
    Ok(())
}

/// The argmax with a whole input layout of `want.len()` rows as its feed, moved on
/// (`graph_advance`): rows of four kinds in turn (padding; a verify row; a one-token row
/// inside its block; one whose next position lies past its table), tables 3 blocks wide of
/// 16 tokens. The device's layout must equal the host's `advance_decode_rows` of it with the
/// tokens in place, and (from 4 rows) that advance must have moved something.
fn advanced(
    k: &CudaKernels,
    (x, want, scratch): (&Tensor, &[u32], &policy_serve::engine::cuda::GreedyScratch),
    dev: &Device,
    t: &mut Table,
) -> Res<()> {
    let rows = want.len();
    let n = x.dim(1)?;
    let (bs, width) = (16u32, 3u32);
    let kind = |r: usize| r % 4;
    let pos = |r: usize| {
        if kind(r) == 3 {
            47
        } else {
            (r as u32 * 7) % 40 + 3
        }
    };
    let mut layout = vec![u32::MAX; rows];
    layout.extend((0..rows).map(pos));
    layout.extend((0..rows).map(|r| match kind(r) {
        0 => u32::MAX,
        _ => (r as u32 * 10 + 1) * bs + pos(r) % bs,
    }));
    layout.extend((0..rows).map(|r| if kind(r) == 0 { 0 } else { pos(r) + 1 }));
    layout.extend((0..rows).map(|r| if kind(r) == 1 { (1 << 16) | 3 } else { 1 }));
    layout.push(width);
    for r in 0..rows as u32 {
        layout.extend((0..width).map(|j| r * 10 + j + 1));
    }
    let mut expect = layout.clone();
    expect[..rows].copy_from_slice(want);
    policy_serve::engine::runner::advance_decode_rows(&mut expect, rows, bs as usize);
    let moved = expect[rows..] != layout[rows..];
    let feed = Tensor::from_vec(layout, expect.len(), dev)?;
    let out = Tensor::zeros((rows, n), DType::F32, dev)?;
    let ids = Tensor::zeros(rows, DType::U32, dev)?;
    k.to_f32_argmax_into(x, &out, (&ids, Some((&feed, bs as usize))), scratch)?;
    let got: Vec<u32> = feed.to_vec1()?;
    let wrong = got.iter().zip(&expect).filter(|(a, b)| a != b).count();
    let what = format!("to_f32_argmax rows {rows} x {n}, the layout moved on");
    t.check(format!("{what}: words wrong"), wrong as f32, 0.0);
    if rows >= 4 {
        t.check(
            format!("{what}: rows moved"),
            if moved { 0.0 } else { 1.0 },
            0.0,
        );
    }
    Ok(())
}
