//! The shared-K/V verify attention (`paged_verify_into`: a sequence's last token and its drafts
//! as consecutive rows, one K/V load for up to 8 / G of them) against the decode kernel that
//! attends one row at a time over the same caches, rows and tables (the engine's verify steps
//! without `--shared-kv-verify`). A kernel whose causal mask let a row see the drafts after it,
//! or whose reduce cut a row's partitions differently from the kernel, fails by far.

use candle_core::{DType, Device, Tensor};
use policy_serve::engine::cuda::{CudaKernels, LaunchOptions};
use policy_serve::engine::kv_format::{KvRef, KvScale, quantize};
use policy_serve::engine::runner::accept::kept_drafts;

use super::{Res, Table, randn, rel};

/// One case (timed too with `time`): sequences given as (rows, context of the first row); a padding row (context 0)
/// after the first sequence; `nh`/`nkv` heads; `splits` partitions (None: an eager step's).
#[allow(clippy::too_many_arguments)]
fn case(
    k: &CudaKernels,
    dev: &Device,
    dt: DType,
    seqs: &[(usize, usize)],
    (nh, nkv): (usize, usize),
    splits: Option<usize>,
    fp8: Option<KvScale>,
    time: bool,
) -> Res<f32> {
    let (hd, bs) = (128usize, 16usize);
    // Rows: (context, run field, sequence).
    let mut rows: Vec<(usize, u32, usize)> = Vec::new();
    for (si, &(n, ctx0)) in seqs.iter().enumerate() {
        for j in 0..n {
            rows.push((ctx0 + j, ((j as u32) << 16) | n as u32, si));
        }
        if si == 0 {
            rows.push((0, 1, usize::MAX));
        }
    }
    let b = rows.len();
    let w = rows
        .iter()
        .map(|r| r.0.div_ceil(bs))
        .max()
        .unwrap_or(1)
        .max(1);
    // Each sequence's blocks in reverse order (a table is not contiguous); a row's table is
    // the prefix of its sequence's that covers its context.
    let mut next = 0u32;
    let tables_of: Vec<Vec<u32>> = seqs
        .iter()
        .map(|&(n, ctx0)| {
            let need = (ctx0 + n - 1).div_ceil(bs) as u32;
            let t: Vec<u32> = (0..need).rev().map(|j| next + j).collect();
            next += need;
            t
        })
        .collect();
    let mut flat = Vec::with_capacity(b * w);
    for &(ctx, _, si) in &rows {
        let used = if si == usize::MAX {
            &[][..]
        } else {
            &tables_of[si][..ctx.div_ceil(bs)]
        };
        flat.extend_from_slice(used);
        flat.extend(std::iter::repeat_n(0u32, w - used.len()));
    }
    let total = next as usize + 1;
    let ctx_u: Vec<u32> = rows.iter().map(|r| r.0 as u32).collect();
    let runs: Vec<u32> = rows.iter().map(|r| r.1).collect();
    let ctx_t = Tensor::new(ctx_u.as_slice(), dev)?;
    let runs_t = Tensor::new(runs.as_slice(), dev)?;
    let tables = Tensor::from_vec(flat, (b, w), dev)?;
    let q = (randn(&[b, nh, hd], dt, dev)? * (1.0 / (hd as f64).sqrt()))?.to_dtype(dt)?;
    let (mut kc, mut vc) = (
        randn(&[nkv, total * bs, hd], dt, dev)?,
        randn(&[nkv, total * bs, hd], dt, dev)?,
    );
    let scale = fp8.unwrap_or(KvScale::ONE);
    if fp8.is_some() {
        kc = quantize(&kc, scale.k)?;
        vc = quantize(&vc, scale.v)?;
    }
    let kv = KvRef {
        scale,
        ..KvRef::plain(&kc, &vc)
    };
    let part = CudaKernels::decode_partition(b);
    let splits = splits.unwrap_or_else(|| CudaKernels::decode_splits(w, bs, part));
    let scratch = k.decode_scratch(b, nh, splits)?;
    let run = |shared: bool| -> Res<Tensor> {
        let out = Tensor::zeros((b, nh * hd), dt, dev)?;
        let sp = (splits, part, scratch.as_ref());
        let t = (&tables, None);
        if shared {
            k.paged_verify_into(&q, kv, t, &ctx_t, &runs_t, bs, &out, sp)?;
        } else {
            k.paged_decode_into(&q, kv, t, &ctx_t, bs, &out, sp)?;
        }
        Ok(out)
    };
    let reference = run(false)?;
    let out = run(true)?;
    if time {
        // Microseconds a launch (with its reduce), 100 back to back between two events.
        let mut us = [0f64; 2];
        for (shared, u) in [false, true].into_iter().zip(&mut us) {
            run(shared)?;
            let t0 = k.event()?;
            for _ in 0..100 {
                run(shared)?;
            }
            *u = k.event()?.ms_since(&t0) * 10.0;
        }
        println!(
            "| {seqs:?} | {b} | {splits} | {:.1} | {:.1} |",
            us[0], us[1]
        );
    }
    rel(&out, &reference)
}

/// Both attentions timed on verify steps of K = 4 and 8 at the graphs' partitions
/// (`graph_splits`: 16 for 5-16 rows, 8 for 17-64), contexts 600 and 8k.
pub fn timings(dev: &Device) -> Res<()> {
    let opts = LaunchOptions {
        shared_kv_verify: true,
        ..super::cores()
    };
    let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
    println!(
        "| sequences (rows, first context) | rows | splits | one row a block, us | shared K/V, us |"
    );
    println!("|---|---|---|---|---|");
    let one = |n: usize, ctx: usize| vec![(n, ctx)];
    let eight = |n: usize, ctx: usize| vec![(n, ctx); 8];
    for (seqs, splits) in [
        (one(5, 600), 16),
        (eight(5, 600), 8),
        (one(9, 600), 16),
        (one(5, 8192), 16),
        (eight(5, 8192), 8),
        (one(9, 32768), 16),
    ] {
        case(
            &k,
            dev,
            DType::BF16,
            &seqs,
            (16, 8),
            Some(splits),
            None,
            true,
        )?;
    }
    Ok(())
}

/// `spec_accept` against the host rule (`kept_drafts`) on 300 sequences of 1-17 rows whose
/// draws match their drafts for a random number of leading rows, then at random (mismatched
/// counts, as a kernel that counted every equal draft would give, fail).
fn accept_check(k: &CudaKernels, dev: &Device, t: &mut Table) -> Res<()> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let (mut ids, mut drafts, mut starts) = (Vec::new(), Vec::new(), vec![0u32]);
    for _ in 0..300 {
        let rows = 1 + next(17) as usize;
        let lead = next(rows as u64 + 1) as usize;
        for j in 0..rows {
            let id = next(8) as u32;
            ids.push(id);
            drafts.push(match j {
                j if j + 1 == rows => u32::MAX,
                j if j < lead => id,
                _ => next(8) as u32,
            });
        }
        starts.push(ids.len() as u32);
    }
    let up = |v: &[u32]| Tensor::new(v, dev);
    let out: Vec<u32> = k
        .spec_accept(&up(&ids)?, &up(&drafts)?, &up(&starts)?)?
        .to_vec1()?;
    let want: Vec<u32> = ids
        .iter()
        .copied()
        .chain(kept_drafts(&ids, &drafts, &starts))
        .collect();
    let wrong =
        out.iter().zip(&want).filter(|(a, b)| a != b).count() + out.len().abs_diff(want.len());
    t.check(
        "spec_accept = the host rule (300 sequences, wrong entries)".into(),
        wrong as f32,
        0.0,
    );
    Ok(())
}

pub fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let opts = LaunchOptions {
        shared_kv_verify: true,
        ..super::cores()
    };
    // (sequences: rows, first context), heads, splits.
    type Case<'a> = (&'a [(usize, usize)], (usize, usize), Option<usize>);
    let cases: &[Case] = &[
        (&[(5, 600)], (16, 8), None),
        (&[(5, 600)], (16, 8), Some(640)),
        (&[(5, 17)], (16, 8), Some(64)),
        (&[(3, 1), (1, 40)], (16, 8), None),
        (&[(9, 1000), (1, 300), (5, 2000)], (16, 8), None),
        (&[(17, 4000), (5, 31)], (16, 8), Some(128)),
        (&[(5, 600), (5, 601), (5, 33)], (8, 8), None),
        (&[(9, 600), (2, 100)], (8, 8), Some(32)),
        (&[(5, 700), (3, 64)], (32, 8), None),
        (&[(5, 700)], (64, 8), None),
    ];
    for dt in [DType::BF16, DType::F32] {
        let k = CudaKernels::new(dev, dt, &opts)?.ok_or("no kernels")?;
        let tol = if dt == DType::F32 { 1e-4 } else { 1e-2 };
        for &(seqs, heads, splits) in cases {
            let err = case(&k, dev, dt, seqs, heads, splits, None, false)?;
            let name = format!(
                "paged_verify {dt:?} seqs {seqs:?} nh {} nkv {} splits {}",
                heads.0,
                heads.1,
                splits.map_or("eager".to_string(), |s| s.to_string())
            );
            t.check(name, err, tol);
        }
    }
    let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
    let scale = KvScale { k: 0.25, v: 4.0 };
    for &(seqs, heads, splits) in &cases[..6] {
        let err = case(
            &k,
            dev,
            DType::BF16,
            seqs,
            heads,
            splits,
            Some(scale),
            false,
        )?;
        t.check(
            format!("paged_verify fp8 seqs {seqs:?} nh {}", heads.0),
            err,
            1e-2,
        );
    }
    accept_check(&k, dev, t)
}
