//! Prefill attention checks: the CUDA-core and tensor-core kernels against the gather path,
//! short and long prompts over cached prefixes.

use super::*;

/// One `n`-token prompt through the prefill kernel (bounded memory: no score matrix), checked
/// against an f32 reference for the query rows `rows` only.
pub(super) fn prefill_long_check(
    k: &CudaKernels,
    dev: &Device,
    dt: DType,
    n: usize,
    rows: &[usize],
) -> Res<f32> {
    let (nh, nkv, hd, bs) = (16usize, 8usize, 128usize, 16usize);
    let g = nh / nkv;
    let blocks = n.div_ceil(bs);
    let kc = randn(&[nkv, blocks * bs, hd], dt, dev)?;
    let vc = randn(&[nkv, blocks * bs, hd], dt, dev)?;
    let q = (randn(&[n, nh, hd], dt, dev)? * (1.0 / (hd as f64).sqrt()))?.to_dtype(dt)?;
    let tile = k.prefill_tile(g);
    let tiles: Vec<u32> = (0..n)
        .step_by(tile)
        .flat_map(|q0| [0u32, q0 as u32])
        .collect();
    let table: Vec<u32> = (0..blocks as u32).rev().collect();
    let meta = [0u32, n as u32, n as u32, 0];
    let out = Tensor::zeros((n, nh * hd), dt, dev)?;
    k.paged_prefill_into(
        &q,
        &kc,
        &vc,
        &Tensor::new(tiles.as_slice(), dev)?,
        &Tensor::new(&meta[..], dev)?,
        &Tensor::new(table.as_slice(), dev)?,
        bs,
        &out,
    )?;
    let slots: Vec<u32> = (0..n)
        .map(|p| table[p / bs] * bs as u32 + (p % bs) as u32)
        .collect();
    let idx = Tensor::new(slots.as_slice(), dev)?;
    let kk = kc.index_select(&idx, 1)?.to_dtype(DType::F32)?; // [nkv, n, hd]
    let vv = vc.index_select(&idx, 1)?.to_dtype(DType::F32)?;
    let mut worst = 0f32;
    for &i in rows {
        let qi = q.i(i)?.to_dtype(DType::F32)?.reshape((nkv, g, hd))?;
        let (ki, vi) = (kk.narrow(1, 0, i + 1)?, vv.narrow(1, 0, i + 1)?);
        let p = candle_nn::ops::softmax_last_dim(&qi.matmul(&ki.transpose(1, 2)?.contiguous()?)?)?;
        let o = p.matmul(&vi.contiguous()?)?.reshape(nh * hd)?;
        worst = worst.max(rel(&out.i(i)?, &o)?);
    }
    Ok(worst)
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
        &kc,
        &vc,
        &Tensor::new(tiles.as_slice(), dev)?,
        &Tensor::new(meta.as_slice(), dev)?,
        &Tensor::new(tables.as_slice(), dev)?,
        bs,
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
