//! Prefill attention checks: the CUDA-core and tensor-core kernels against the gather path,
//! short and long prompts over cached prefixes.

use super::*;
use policy_serve::engine::cuda::LaunchOptions;

/// One chunk of `q_len` query tokens at the end of a `ctx`-token sequence (a cached prefix of
/// `ctx - q_len`) through the prefill kernel (bounded memory: no score matrix), checked
/// against an f32 reference for the chunk rows `rows` only.
#[allow(clippy::too_many_arguments)]
pub(super) fn prefill_rows_check(
    k: &CudaKernels,
    dev: &Device,
    dt: DType,
    q_len: usize,
    ctx: usize,
    nh: usize,
    nkv: usize,
    rows: &[usize],
) -> Res<f32> {
    let (hd, bs) = (128usize, 16usize);
    let g = nh / nkv;
    let blocks = ctx.div_ceil(bs);
    let kc = randn(&[nkv, blocks * bs, hd], dt, dev)?;
    let vc = randn(&[nkv, blocks * bs, hd], dt, dev)?;
    let q = (randn(&[q_len, nh, hd], dt, dev)? * (1.0 / (hd as f64).sqrt()))?.to_dtype(dt)?;
    let (tiles, table) = one_seq_tiles(k, g, q_len, ctx, bs);
    let meta = [0u32, q_len as u32, ctx as u32, 0];
    let out = Tensor::zeros((q_len, nh * hd), dt, dev)?;
    k.paged_prefill_into(
        &q,
        KvRef::plain(&kc, &vc),
        &Tensor::new(tiles.as_slice(), dev)?,
        &Tensor::new(&meta[..], dev)?,
        &Tensor::new(table.as_slice(), dev)?,
        bs,
        ctx,
        &out,
    )?;
    let slots: Vec<u32> = (0..ctx)
        .map(|p| table[p / bs] * bs as u32 + (p % bs) as u32)
        .collect();
    let idx = Tensor::new(slots.as_slice(), dev)?;
    let kk = kc.index_select(&idx, 1)?.to_dtype(DType::F32)?; // [nkv, ctx, hd]
    let vv = vc.index_select(&idx, 1)?.to_dtype(DType::F32)?;
    let mut worst = 0f32;
    for &i in rows.iter().filter(|&&i| i < q_len) {
        let keys = ctx - q_len + i + 1;
        let qi = q.i(i)?.to_dtype(DType::F32)?.reshape((nkv, g, hd))?;
        let (ki, vi) = (kk.narrow(1, 0, keys)?, vv.narrow(1, 0, keys)?);
        let p = candle_nn::ops::softmax_last_dim(&qi.matmul(&ki.transpose(1, 2)?.contiguous()?)?)?;
        let o = p.matmul(&vi.contiguous()?)?.reshape(nh * hd)?;
        worst = worst.max(rel(&out.i(i)?, &o)?);
    }
    Ok(worst)
}

/// The tiles of one sequence's chunk and a block table in reverse order (not the identity).
fn one_seq_tiles(
    k: &CudaKernels,
    g: usize,
    q_len: usize,
    ctx: usize,
    bs: usize,
) -> (Vec<u32>, Vec<u32>) {
    let tiles = (0..q_len)
        .step_by(k.prefill_tile(g))
        .flat_map(|q0| [0u32, q0 as u32])
        .collect();
    (tiles, (0..ctx.div_ceil(bs) as u32).rev().collect())
}

/// The prefill kernels: the default flash kernel (wgmma on sm_90, split-KV for launches of
/// few blocks), the same without split-KV, the mma.sync flash kernel, the two-pass WMMA kernel.
fn variants() -> [LaunchOptions; 4] {
    let flash = LaunchOptions::default();
    [
        flash,
        LaunchOptions {
            split_kv: false,
            ..flash
        },
        LaunchOptions {
            wgmma_prefill: false,
            ..flash
        },
        LaunchOptions {
            flash_prefill: false,
            ..flash
        },
    ]
}

/// Every prefill kernel (flash and two-pass WMMA for bf16, CUDA cores for f32) against the
/// references: small ragged batches in full, long prompts and long cached prefixes by rows.
pub(super) fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let [flash, nosplit, mma, wmma] = variants();
    let x1 = LaunchOptions {
        wgmma_prefill_x2: false,
        ..flash
    };
    for (dt, opts, kind) in [
        (DType::BF16, flash, "flash"),
        (DType::BF16, nosplit, "flash-nosplit"),
        (DType::BF16, x1, "flash-x1"),
        (DType::BF16, mma, "flash-mma"),
        (DType::BF16, wmma, "wmma"),
        (DType::F32, flash, "cuda-core"),
    ] {
        let k = CudaKernels::new(dev, dt, &opts)?.ok_or("no kernels")?;
        for &(nh, nkv) in &[(16usize, 8usize), (32, 8), (16, 16), (32, 4), (64, 8)] {
            if !k.prefill_supports(nh / nkv) {
                continue;
            }
            for (specs, name) in [
                (vec![(1usize, 1usize)], "one 1-token prompt"),
                (vec![(2usize, 2usize)], "one 2-token prompt"),
                (vec![(512, 512)], "512 prompt"),
                (vec![(200, 700)], "200 over cached 500"),
                (vec![(3, 1000)], "3 over cached 997"),
                (
                    vec![(17, 17), (64, 64), (33, 300), (512, 512), (5, 1029)],
                    "5 ragged, cached prefixes",
                ),
                (vec![(2048, 2048)], "2048 prompt"),
            ] {
                if (nh, nkv) != (16, 8) && specs.len() > 1 {
                    continue;
                }
                let e = prefill_check(&k, dev, dt, &specs, nh, nkv)?;
                t.check(
                    format!("paged_prefill {kind} {dt:?} {name} nh {nh} nkv {nkv}"),
                    e,
                    tol(dt),
                );
            }
        }
        if dt != DType::BF16 {
            continue;
        }
        // (chunk, context, heads): one prompt up to 32k, chunks of 512..8k over cached
        // prefixes up to 31k, GQA 16/8, 32/8, 32/4.
        let long: &[(usize, usize, usize, usize)] = if kind.starts_with("flash") {
            &[
                (32_768, 32_768, 16, 8),
                (8_192, 8_192, 32, 8),
                (8_192, 8_192, 32, 4),
                (512, 31_744, 16, 8),
                (2_048, 32_000, 16, 8),
                (8_192, 31_000, 16, 8),
                (4_096, 20_000, 32, 4),
                (1_000, 16_385, 32, 8),
                (77, 31_000, 16, 8),
            ]
        } else {
            &[(32_768, 32_768, 16, 8)]
        };
        for &(q_len, ctx, nh, nkv) in long {
            let rows = [0, 1, 63, 64, q_len / 2, q_len - 2, q_len - 1];
            let e = prefill_rows_check(&k, dev, dt, q_len, ctx, nh, nkv, &rows)?;
            t.check(
                format!(
                    "paged_prefill {kind} {dt:?} {q_len} over {ctx} (7 rows) nh {nh} nkv {nkv}"
                ),
                e,
                tol(dt),
            );
        }
    }
    Ok(())
}

/// Time of the prefill attention kernel alone (bf16, flash and WMMA) for one sequence and
/// 0.6B's heads (16 query, 8 KV, 28 layers' worth reported per layer): one whole prompt of
/// P tokens, and a 2k chunk over a long prefix. Prints ms per layer and achieved TFLOP/s
/// (causal: 4 * q_len * mean keys * 128 * heads).
pub(super) fn timings(dev: &Device) -> Res<()> {
    let (nh, nkv, hd, bs) = (16usize, 8usize, 128usize, 16usize);
    let cases = [
        (2_048usize, 2_048usize),
        (8_192, 8_192),
        (16_384, 16_384),
        (32_768, 32_768),
        (2_048, 32_768),
        (512, 32_768),
    ];
    let [flash, nosplit, mma, wmma] = variants();
    let x1 = LaunchOptions {
        wgmma_prefill_x2: false,
        ..flash
    };
    for (opts, kind) in [
        (flash, "flash"),
        (nosplit, "flash-nosplit"),
        (x1, "flash-x1"),
        (mma, "flash-mma"),
        (wmma, "wmma"),
    ] {
        let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
        for &(q_len, ctx) in &cases {
            if kind == "wmma" && ctx > 16_384 && q_len == ctx {
                continue;
            }
            let blocks = ctx.div_ceil(bs);
            let kc = randn(&[nkv, blocks * bs, hd], DType::BF16, dev)?;
            let vc = randn(&[nkv, blocks * bs, hd], DType::BF16, dev)?;
            let q = randn(&[q_len, nh, hd], DType::BF16, dev)?;
            let (tiles, table) = one_seq_tiles(&k, nh / nkv, q_len, ctx, bs);
            let meta = [0u32, q_len as u32, ctx as u32, 0];
            let (tiles, meta, table) = (
                Tensor::new(tiles.as_slice(), dev)?,
                Tensor::new(&meta[..], dev)?,
                Tensor::new(table.as_slice(), dev)?,
            );
            let out = Tensor::zeros((q_len, nh * hd), DType::BF16, dev)?;
            let mut best = f64::MAX;
            for _ in 0..4 {
                dev.synchronize()?;
                let t0 = std::time::Instant::now();
                k.paged_prefill_into(
                    &q,
                    KvRef::plain(&kc, &vc),
                    &tiles,
                    &meta,
                    &table,
                    bs,
                    ctx,
                    &out,
                )?;
                dev.synchronize()?;
                best = best.min(t0.elapsed().as_secs_f64());
            }
            let mean_keys = (ctx - q_len) as f64 + (q_len as f64 + 1.0) / 2.0;
            let flops = 4.0 * q_len as f64 * mean_keys * hd as f64 * nh as f64;
            println!(
                "prefill-attention {kind:<9} {q_len:>6} over {ctx:>6}: {:>8.3} ms/layer \
                 ({:>6.1} ms for 28 layers) {:>6.1} TFLOP/s",
                best * 1e3,
                best * 28e3,
                flops / best / 1e12
            );
        }
    }
    Ok(())
}

/// Prefill chunks `(q_len, ctx)` of several sequences in one launch against a per-token f32
/// reference (causal over the cached prefix plus the chunk).
pub(super) fn prefill_check(
    k: &CudaKernels,
    dev: &Device,
    dt: DType,
    specs: &[(usize, usize)],
    nh: usize,
    nkv: usize,
) -> Res<f32> {
    let (hd, bs, tile) = (128usize, 16usize, k.prefill_tile(nh / nkv));
    let total_blocks: usize = specs.iter().map(|(_, c)| c.div_ceil(bs)).sum::<usize>() + 1;
    let kc = randn(&[nkv, total_blocks * bs, hd], dt, dev)?;
    let vc = randn(&[nkv, total_blocks * bs, hd], dt, dev)?;
    let t: usize = specs.iter().map(|(q, _)| q).sum();
    let q = (randn(&[t, nh, hd], dt, dev)? * (1.0 / (hd as f64).sqrt()))?.to_dtype(dt)?;
    let (mut tiles, mut meta, mut tables, mut per_seq) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut row, mut next_block) = (0usize, 0usize);
    for (si, &(ql, ctx)) in specs.iter().enumerate() {
        let n = ctx.div_ceil(bs);
        // Blocks in reverse order, so the table is not the identity.
        let table: Vec<u32> = (0..n).rev().map(|b| (next_block + b) as u32).collect();
        next_block += n;
        for q0 in (0..ql).step_by(tile) {
            tiles.extend([si as u32, q0 as u32]);
        }
        meta.extend([row as u32, ql as u32, ctx as u32, tables.len() as u32]);
        tables.extend_from_slice(&table);
        per_seq.push((row, ql, ctx, table));
        row += ql;
    }
    let out = Tensor::zeros((t, nh * hd), dt, dev)?;
    k.paged_prefill_into(
        &q,
        KvRef::plain(&kc, &vc),
        &Tensor::new(tiles.as_slice(), dev)?,
        &Tensor::new(meta.as_slice(), dev)?,
        &Tensor::new(tables.as_slice(), dev)?,
        bs,
        specs.iter().map(|s| s.1).max().unwrap_or(0),
        &out,
    )?;
    let g = nh / nkv;
    let mut worst = 0f32;
    for (row, ql, ctx, table) in per_seq {
        let slots: Vec<u32> = (0..ctx)
            .map(|p| table[p / bs] * bs as u32 + (p % bs) as u32)
            .collect();
        let idx = Tensor::new(slots.as_slice(), dev)?;
        let kk = kc.index_select(&idx, 1)?.to_dtype(DType::F32)?; // [nkv, ctx, hd]
        let vv = vc.index_select(&idx, 1)?.to_dtype(DType::F32)?;
        // [nkv, g * ql, hd] queries; causal mask: query i sees keys <= ctx - ql + i.
        let qs = q
            .narrow(0, row, ql)?
            .to_dtype(DType::F32)?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((nkv, g * ql, hd))?;
        let mask: Vec<f32> = (0..g * ql)
            .flat_map(|r| {
                let i = r % ql;
                (0..ctx).map(move |j| {
                    if j <= ctx - ql + i {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (g * ql, ctx), dev)?;
        let p = candle_nn::ops::softmax_last_dim(
            &qs.matmul(&kk.transpose(1, 2)?)?.broadcast_add(&mask)?,
        )?;
        let o = p
            .matmul(&vv)?
            .reshape((nh, ql, hd))?
            .transpose(0, 1)?
            .reshape((ql, nh * hd))?;
        worst = worst.max(rel(&out.narrow(0, row, ql)?, &o)?);
    }
    Ok(worst)
}
