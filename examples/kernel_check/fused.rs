//! The fused decode attention (`decode_fused_into`: q/k norm + RoPE + KV write + attention +
//! merge in one launch) against the unfused kernels it replaces, which the other checks hold
//! against candle: the output must be the same bits at the same partitioning (within bf16
//! rounding where clusters merge in two levels), the written K/V rows the same bits, and the
//! merge counters zero after every launch (they are reused by the next).

use candle_core::{DType, Device, Tensor};
use policy_serve::engine::cuda::{CudaKernels, LaunchOptions};
use policy_serve::engine::kv_format::{KvRef, KvScale, quantize};

use super::{Res, Table, cores, randn, rel};

/// One case: `b` rows with ragged contexts (row 1 a padding row when `pad`), `nh`/`nkv`
/// heads, attention in `splits` partitions (None: as many as an eager step takes); with
/// `fp8`, over fp8 caches with those scales. The reference is `k`'s unfused kernels where
/// the context fits one cluster, else `cores`' (`fused_mma` kernels attend on tensor cores in
/// one cluster only; `cores` is `k` for the others). The launch is `short` (the tensor-core
/// kernels may run) exactly where the engine's would be
/// (`CudaKernels::fused_short_context`: in clusters, every context within one): those kernels
/// have no other loop.
pub(crate) fn case(
    (k, cores): (&CudaKernels, &CudaKernels),
    dev: &Device,
    (b, max_ctx, pad): (usize, usize, bool),
    (nh, nkv): (usize, usize),
    splits: Option<usize>,
    fp8: Option<KvScale>,
) -> Res<(f32, f32, u32, bool)> {
    let (hd, bs, dt) = (128usize, 16usize, DType::BF16);
    let ctx: Vec<usize> = (0..b)
        .map(|i| match i {
            0 => max_ctx,
            1 if pad => 0,
            _ => 1 + (i * 7919 + 13) % max_ctx,
        })
        .collect();
    let need: Vec<usize> = ctx.iter().map(|c| c.div_ceil(bs)).collect();
    let total = need.iter().sum::<usize>() + 3;
    let w = need.iter().copied().max().unwrap_or(1).max(1);
    let mut flat = Vec::new();
    let mut next = 0u32;
    let mut slots = Vec::new();
    for (i, n) in need.iter().enumerate() {
        // Blocks in reverse order, so a table is not contiguous.
        let tb: Vec<u32> = (0..*n as u32).rev().map(|j| next + j).collect();
        next += *n as u32;
        slots.push(match ctx[i] {
            0 => u32::MAX,
            c => tb[(c - 1) / bs] * bs as u32 + ((c - 1) % bs) as u32,
        });
        flat.extend_from_slice(&tb);
        flat.extend(std::iter::repeat_n(0u32, w - tb.len()));
    }
    let theta = 1_000_000f64;
    let inv: Vec<f32> = (0..hd)
        .step_by(2)
        .map(|i| 1f32 / theta.powf(i as f64 / hd as f64) as f32)
        .collect();
    let inv = Tensor::new(inv.as_slice(), dev)?;
    let qkv = randn(&[b, (nh + 2 * nkv) * hd], dt, dev)?;
    let qw =
        (randn(&[hd], dt, dev)?.affine(0.1, 1.0)? * (1.0 / (hd as f64).sqrt()))?.to_dtype(dt)?;
    let kw = randn(&[hd], dt, dev)?.affine(0.1, 1.0)?;
    let pos: Vec<u32> = ctx.iter().map(|&c| c.saturating_sub(1) as u32).collect();
    let (pos, slots_t) = (
        Tensor::new(pos.as_slice(), dev)?,
        Tensor::new(slots.as_slice(), dev)?,
    );
    let ctx_u: Vec<u32> = ctx.iter().map(|&c| c as u32).collect();
    let ctx_t = Tensor::new(ctx_u.as_slice(), dev)?;
    let tables = Tensor::from_vec(flat, (b, w), dev)?;
    let width = Tensor::new(&[w as u32], dev)?;
    let mut kc0 = randn(&[nkv, total * bs, hd], dt, dev)?;
    let mut vc0 = randn(&[nkv, total * bs, hd], dt, dev)?;
    let scale = fp8.unwrap_or(KvScale::ONE);
    if fp8.is_some() {
        kc0 = quantize(&kc0, scale.k)?;
        vc0 = quantize(&vc0, scale.v)?;
    }
    let part = CudaKernels::decode_partition(b);
    let splits =
        splits.unwrap_or_else(|| k.cluster_splits(b, CudaKernels::decode_splits(w, bs, part)));
    let scratch = k.decode_scratch(b, nh, splits)?;
    // In clusters, a context of up to C * 128 tokens is cut in C partitions of ceil(ctx / C)
    // (the unfused kernels' partitioning at C splits of at least 16 tokens) and merged in one
    // level: the same bits. Longer ones merge in two levels: rounding differs.
    let c = k.decode_cluster(b, nh / nkv, splits);
    let exact = c == 1 || max_ctx <= c * 128;
    let short = c > 1 && max_ctx <= c * 128;
    let (ref_splits, ref_part) = if short { (c, 16) } else { (splits, part) };
    let ref_scratch = k.decode_scratch(b, nh, ref_splits)?;
    let r = if short { k } else { cores };

    // Unfused: norm + RoPE + KV write, then attention and its merge.
    let (kc1, vc1) = (kc0.copy()?, vc0.copy()?);
    let q = Tensor::zeros((b, nh, hd), dt, dev)?;
    r.qk_norm_rope_kv_write_into(
        &qkv,
        (&qw, &kw),
        &inv,
        (&pos, &slots_t),
        KvRef {
            k: &kc1,
            v: &vc1,
            scale,
            fresh: None,
        },
        (nh, nkv, hd),
        1e-6,
        &q,
    )?;
    let out1 = Tensor::zeros((b, nh * hd), dt, dev)?;
    r.paged_decode_into(
        &q,
        KvRef {
            k: &kc1,
            v: &vc1,
            scale,
            fresh: None,
        },
        (&tables, Some(&width)),
        &ctx_t,
        bs,
        &out1,
        (ref_splits, ref_part, ref_scratch.as_ref()),
    )?;
    // Fused, twice (the second launch finds the counters the first left).
    let (kc2, vc2) = (kc0.copy()?, vc0.copy()?);
    let counters = k.decode_counters(b, nh)?;
    let mut worst = 0f32;
    for _ in 0..2 {
        let out2 = Tensor::ones((b, nh * hd), dt, dev)?;
        k.decode_fused_into(
            &qkv,
            (&qw, &kw, 1e-6),
            &inv,
            (&pos, &slots_t),
            KvRef {
                k: &kc2,
                v: &vc2,
                scale,
                fresh: None,
            },
            (&tables, Some(&width)),
            &ctx_t,
            bs,
            &out2,
            (splits, part, scratch.as_ref(), &counters),
            short,
        )?;
        worst = worst.max(if exact {
            max_abs_diff(&out1, &out2)?
        } else {
            rel(&out2, &out1)?
        });
    }
    let cache = max_abs_diff(&kc1, &kc2)?.max(max_abs_diff(&vc1, &vc2)?);
    let left = counters.sum_all()?.to_scalar::<u32>()?;
    Ok((worst, cache, left, exact))
}

/// (rows, longest context, row 1 padding), (nh, nkv), splits (None: an eager step's).
type Case = ((usize, usize, bool), (usize, usize), Option<usize>);

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Res<f32> {
    let d = (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?;
    Ok(d.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

/// `cores()` with the fused decode attention's table index by division
/// (`LaunchOptions::fused_lean` off).
pub(crate) fn division_kernels(dev: &Device) -> Res<CudaKernels> {
    let o = LaunchOptions {
        fused_lean: false,
        ..cores()
    };
    Ok(CudaKernels::new(dev, DType::BF16, &o)?.ok_or("no kernels")?)
}

/// `cores()` with the fused decode attention's tensor-core loop at `stages` a warp for every
/// launch (`LaunchOptions::fused_mma`, no row bound) and the unfused tensor-core attention
/// (`mma_decode`) it is held to.
pub(crate) fn mma_kernels(dev: &Device, stages: u8) -> Res<CudaKernels> {
    let o = LaunchOptions {
        mma_decode: true,
        fused_mma: Some(stages),
        fused_mma_rows: usize::MAX,
        ..cores()
    };
    Ok(CudaKernels::new(dev, DType::BF16, &o)?.ok_or("no kernels")?)
}

pub fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let k = CudaKernels::new(dev, DType::BF16, &cores())?.ok_or("no kernels")?;
    // Group 8 runs as two group-4 halves a KV head, merged in clusters (`gqa8_split`, on in
    // `cores()`): the same bits as the unfused kernels at the clusters' partitioning (a half
    // that read the wrong KV head, wrote the new row with other values, or took the other
    // half's query heads fails it). The group-8 cases run once more whole (`--no-gqa8-split`:
    // no clusters, the merge through global memory).
    let whole = LaunchOptions {
        gqa8_split: false,
        ..cores()
    };
    let k8 = CudaKernels::new(dev, DType::BF16, &whole)?.ok_or("no kernels")?;
    // The lean kernels (`LaunchOptions::fused_lean`, on in `cores()`) and, every case once
    // more, the ones with the table index by division, both held to the same tolerances (a
    // table index or offset by shift and mask that missed a block or a row fails the first).
    let kd = division_kernels(dev)?;
    // The tensor-core loop (`LaunchOptions::fused_mma`, 1 and 2 stages a warp), every case
    // once more: where a context fits one cluster against the unfused tensor-core kernels
    // (`mma_decode`), whose bits it must give at the same partitioning (a chunk of the wrong
    // table block, a stage refilled before it was read, or the new token's row not patched
    // into its stage fails it); past one cluster the CUDA-core kernels run, as the engine
    // launches them, against the unfused CUDA-core kernels.
    let (km1, km2) = (mma_kernels(dev, 1)?, mma_kernels(dev, 2)?);
    let cases: &[Case] = &[
        ((1, 600, false), (16, 8), None),
        ((1, 600, false), (16, 8), Some(32)),
        ((1, 5000, false), (16, 8), Some(32)),
        ((4, 3000, true), (16, 8), Some(32)),
        // The graphs' defaults for 3-4 and 5-16 rows (`GRAPH_SPLITS_FEW`, `GRAPH_SPLITS_MID`)
        // over contexts past one cluster's 2,048 tokens.
        ((4, 3000, true), (16, 8), Some(16)),
        ((8, 3000, true), (16, 8), Some(8)),
        ((1, 1024, false), (16, 8), Some(32)),
        ((1, 1100, false), (16, 8), Some(32)),
        ((2, 300, false), (16, 8), Some(32)),
        ((3, 17, true), (8, 8), Some(32)),
        ((8, 700, true), (32, 8), Some(16)),
        ((8, 40, false), (64, 8), None),
        ((40, 900, true), (16, 8), Some(8)),
        ((40, 900, false), (16, 8), None),
        ((200, 300, true), (16, 8), Some(4)),
        // GQA group 8 (the 30B-A3B's 32 / 4 heads): 1 row eager and at 32 partitions, padding
        // rows, 8 rows.
        ((1, 600, false), (32, 4), None),
        ((1, 600, false), (32, 4), Some(32)),
        ((1, 1100, false), (32, 4), Some(32)),
        ((4, 3000, true), (32, 4), Some(32)),
        ((8, 700, true), (32, 4), Some(16)),
        ((8, 3000, true), (32, 4), Some(8)),
    ];
    let g8 = cases.iter().filter(|c| c.1.0 / c.1.1 == 8);
    let runs = cases
        .iter()
        .map(|c| (&k, &k, c, ""))
        .chain(g8.map(|c| (&k8, &k8, c, " whole")))
        .chain(cases.iter().map(|c| (&kd, &kd, c, " division")))
        .chain(cases.iter().map(|c| (&km1, &k, c, " mma1")))
        .chain(cases.iter().map(|c| (&km2, &k, c, " mma2")));
    for (kf, kc, &(rows, heads, splits), how) in runs {
        let (out, cache, left, exact) = case((kf, kc), dev, rows, heads, splits, None)?;
        let name = format!(
            "decode_fused{how} B {} ctx {} nh {} nkv {} splits {}",
            rows.0,
            rows.1,
            heads.0,
            heads.1,
            splits.map_or("eager".to_string(), |s| s.to_string())
        );
        if exact {
            t.check(format!("{name} (out = unfused, bits)"), out, 0.0);
        } else {
            // Two-level merge across clusters: bf16 rounding of the output may differ.
            t.check(
                format!("{name} (out ~ unfused, two-level merge)"),
                out,
                1e-2,
            );
        }
        t.check(format!("{name} (K/V = unfused)"), cache, 0.0);
        t.check(format!("{name} (counters left)"), left as f32, 0.0);
    }
    Ok(())
}
