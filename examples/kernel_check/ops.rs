//! The layer ops one by one against candle-op or host references: add + RMSNorm, SiLU·up, the
//! argmax, top-k, whole-vocabulary sampling, log-prob, repetition-penalty, mask and row-gather
//! kernels over the logits, paged decode attention (the default launch paths) and q/k norm +
//! RoPE + KV write.

use candle_core::{D, DType, Device, IndexOp, Tensor};
use policy_serve::engine::cuda::{CudaKernels, LaunchOptions};
use policy_serve::engine::kv_format::KvRef;

use super::{Res, Table, randn, rel, tol};

pub(super) fn op_checks(dev: &Device, dt: DType, t: &mut Table) -> Res<()> {
    let k = CudaKernels::new(dev, dt, &LaunchOptions::default())?.ok_or("no kernels")?;
    for &(rows, n) in &[(1usize, 1024usize), (7, 2048), (300, 1024)] {
        let (x, r) = (randn(&[rows, n], dt, dev)?, randn(&[rows, n], dt, dev)?);
        let w = randn(&[n], dt, dev)?.affine(0.1, 1.0)?;
        let s = (&r + &x)?;
        let out = k.add_rmsnorm(Some(&x), &r, &w, 1e-6)?;
        let res = r; // updated in place
        let reference =
            candle_nn::ops::rms_norm(&s.to_dtype(DType::F32)?, &w.to_dtype(DType::F32)?, 1e-6)?;
        t.check(
            format!("add_rmsnorm {dt:?} rows {rows} n {n} (sum)"),
            rel(&res, &s)?,
            tol(dt),
        );
        t.check(
            format!("add_rmsnorm {dt:?} rows {rows} n {n} (norm)"),
            rel(&out, &reference)?,
            tol(dt),
        );
    }
    for &(rows, inter) in &[(1usize, 3072usize), (64, 3072), (513, 6144)] {
        let gu = randn(&[rows, 2 * inter], dt, dev)?;
        let out = k.silu_mul(&gu)?;
        let g = gu.narrow(1, 0, inter)?.to_dtype(DType::F32)?;
        let u = gu.narrow(1, inter, inter)?.to_dtype(DType::F32)?;
        let reference = (candle_nn::ops::silu(&g)? * u)?;
        t.check(
            format!("silu_mul {dt:?} rows {rows} inter {inter}"),
            rel(&out, &reference)?,
            tol(dt),
        );
    }
    argmax_checks(&k, dev, t)?;
    super::greedy::checks(dev, dt, t)?;
    for &(rows, kk) in &[(1usize, 20usize), (64, 20), (8, 64)] {
        // Logits with many exact ties (rounded to 0.25) to test the order on ties.
        let l = (randn(&[rows, 151_936], DType::F32, dev)? * 4.0)?
            .round()?
            .affine(0.25, 0.0)?;
        let (vals, ids) = k.topk(&l, kk)?;
        let (vals, ids): (Vec<Vec<f32>>, Vec<Vec<u32>>) = (vals.to_vec2()?, ids.to_vec2()?);
        let host: Vec<Vec<f32>> = l.to_vec2()?;
        let mut wrong = 0;
        for (r, row) in host.iter().enumerate() {
            let mut order: Vec<u32> = (0..row.len() as u32).collect();
            order.sort_by(|a, b| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b)));
            if ids[r] != order[..kk]
                || vals[r]
                    .iter()
                    .zip(&order[..kk])
                    .any(|(v, i)| *v != row[*i as usize])
            {
                wrong += 1;
            }
        }
        t.check(
            format!("topk f32 rows {rows} k {kk} with ties (rows wrong)"),
            wrong as f32,
            0.0,
        );
    }
    // Whole-vocabulary draws against the inverse CDF in token-id order on the host (f64):
    // rows alternate greedy (k 1) and sampled at temperatures 0.7 / 1.3; a draw may differ
    // only where the host's cumulative sum lands within rounding of the uniform.
    {
        let rows = 96usize;
        let l = (randn(&[rows, 151_936], DType::F32, dev)? * 3.0)?;
        let host: Vec<Vec<f32>> = l.to_vec2()?;
        let mut params = Vec::new();
        for r in 0..rows {
            let u = ((r * 7919 + 13) % 1000) as f32 / 1000.0;
            match r % 3 {
                0 => params.extend([1.0, 1.0, 0.0, 1.0]),
                1 => params.extend([0.7, 1.0, u, 0.0]),
                _ => params.extend([1.3, 1.0, u, 0.0]),
            }
        }
        let got: Vec<u32> = k.sample_full(&l, &params)?.to_vec1()?;
        let (mut wrong, mut near) = (0, 0);
        for (r, row) in host.iter().enumerate() {
            let (t, u, greedy) = (params[4 * r], params[4 * r + 2], r % 3 == 0);
            let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let expect = if greedy {
                row.iter().position(|&v| v == mx).unwrap_or(0) as u32
            } else {
                let w: Vec<f64> = row.iter().map(|&v| (((v - mx) / t) as f64).exp()).collect();
                let target = u as f64 * w.iter().sum::<f64>();
                let mut acc = 0.0;
                let mut pick = w.len() - 1;
                for (i, x) in w.iter().enumerate() {
                    acc += x;
                    if target < acc {
                        pick = i;
                        // Within 1e-5 of the total of a neighbour: rounding may pick either.
                        if (acc - target).min(target - (acc - x)) < 1e-5 * acc {
                            near += 1;
                        }
                        break;
                    }
                }
                pick as u32
            };
            if got[r] != expect {
                wrong += 1;
            }
        }
        t.check(
            format!("sample_full f32 rows {rows} x 151936 (rows wrong beyond rounding)"),
            (wrong - wrong.min(near)) as f32,
            0.0,
        );
    }
    // Log-probabilities of drawn tokens (`logprob_rows_f32`) against f64 on the host: rows
    // picked out of order, temperatures 0.5-1.5, some logits -inf.
    {
        let (n_rows, vocab) = (64usize, 151_936usize);
        let mut host: Vec<Vec<f32>> =
            (randn(&[n_rows, vocab], DType::F32, dev)? * 4.0)?.to_vec2()?;
        for (r, row) in host.iter_mut().enumerate() {
            for i in (r..vocab).step_by(97) {
                row[i] = f32::NEG_INFINITY;
            }
        }
        let flat: Vec<f32> = host.iter().flatten().copied().collect();
        let l = Tensor::from_vec(flat, (n_rows, vocab), dev)?;
        let pick: Vec<u32> = (0..48u32).map(|j| (j * 37 + 5) % n_rows as u32).collect();
        let inv_t: Vec<f32> = (0..48)
            .map(|j| 1.0 / (0.5 + (j % 11) as f32 / 10.0))
            .collect();
        // The token drawn from each logits row (as the draw leaves them on the device).
        let ids: Vec<u32> = (0..n_rows as u32)
            .map(|r| (r * 7919 + 1) % vocab as u32 / 97 * 97 + 1)
            .collect();
        let chosen: Vec<u32> = pick.iter().map(|&r| ids[r as usize]).collect();
        let got: Vec<Vec<f32>> = k
            .logprob_rows(
                &l,
                &Tensor::new(pick.as_slice(), dev)?,
                &Tensor::new(inv_t.as_slice(), dev)?,
                &Tensor::new(ids.as_slice(), dev)?,
            )?
            .to_vec2()?;
        let mut worst = 0f64;
        for (j, g) in got.iter().enumerate() {
            let row = &host[pick[j] as usize];
            let it = inv_t[j] as f64;
            let m = row
                .iter()
                .filter(|v| v.is_finite())
                .fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64 * it));
            let lse = m + row
                .iter()
                .filter(|v| v.is_finite())
                .map(|&v| (v as f64 * it - m).exp())
                .sum::<f64>()
                .ln();
            let want = row[chosen[j] as usize] as f64 * it - lse;
            worst = worst
                .max((g[0] as f64 - lse).abs() / lse.abs().max(1.0))
                .max((g[1] as f64 - want).abs() / want.abs().max(1.0));
        }
        t.check(
            "logprob_rows f32 48 of 64 rows x 151936, -inf entries (max rel err)".to_string(),
            worst as f32,
            2e-5,
        );
    }
    // The repetition penalty in place against the host rule, on a copy of random logits.
    {
        let (n_rows, vocab) = (8usize, 151_936usize);
        let l = (randn(&[n_rows, vocab], DType::F32, dev)? * 3.0)?;
        let before: Vec<Vec<f32>> = l.to_vec2()?;
        let at: Vec<u32> = (0..n_rows as u32)
            .flat_map(|r| {
                (0..50u32).map(move |j| r * vocab as u32 + (j * 2999 + r * 7) % vocab as u32)
            })
            .collect();
        let p: Vec<f32> = (0..at.len()).map(|i| 1.1 + (i % 5) as f32 * 0.2).collect();
        let out = l.copy()?;
        k.repetition_penalty(
            &out,
            &Tensor::new(at.as_slice(), dev)?,
            &Tensor::new(p.as_slice(), dev)?,
        )?;
        let after: Vec<Vec<f32>> = out.to_vec2()?;
        let mut want = before.clone();
        for (i, &a) in at.iter().enumerate() {
            let (r, c) = (a as usize / vocab, a as usize % vocab);
            let v = before[r][c];
            want[r][c] = if v > 0.0 { v / p[i] } else { v * p[i] };
        }
        let wrong = want
            .iter()
            .flatten()
            .zip(after.iter().flatten())
            .filter(|(a, b)| a != b)
            .count();
        t.check(
            "repetition_penalty f32 8 x 151936 (entries wrong)".to_string(),
            wrong as f32,
            0.0,
        );
        // A grammar's masks (bits) on rows 6 and 1, and row 3 forced to token 100,003 (a
        // mask of one token travels as the token): disallowed entries -inf, the rest and the
        // other rows untouched.
        let words = vocab.div_ceil(32);
        let mask_rows: Vec<u32> = vec![6, 3, 1];
        let forced: [u32; 3] = [u32::MAX, 100_003, u32::MAX];
        let at: [u32; 3] = [1, u32::MAX, 0];
        let masks: Vec<u32> = (0..2 * words)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761) ^ if i % 7 == 0 { u32::MAX } else { 0 })
            .collect();
        let spec: Vec<u32> = [mask_rows.as_slice(), &forced, &at].concat();
        let masked = l.copy()?;
        k.mask_tokens(
            &masked,
            &Tensor::from_vec(masks.clone(), (2, words), dev)?,
            &Tensor::new(spec.as_slice(), dev)?,
        )?;
        let got: Vec<Vec<f32>> = masked.to_vec2()?;
        let mut wrong = 0usize;
        for (r, row) in got.iter().enumerate() {
            let m = mask_rows.iter().position(|&x| x as usize == r);
            for (t, &v) in row.iter().enumerate() {
                let allowed = m.is_none_or(|m| match forced[m] {
                    u32::MAX => (masks[at[m] as usize * words + t / 32] >> (t % 32)) & 1 == 1,
                    f => t as u32 == f,
                });
                let want = if allowed {
                    before[r][t]
                } else {
                    f32::NEG_INFINITY
                };
                wrong += (v != want) as usize;
            }
        }
        t.check(
            "mask_tokens f32 2 masks + 1 forced on 8 x 151936 (entries wrong)".to_string(),
            wrong as f32,
            0.0,
        );
        let rows: Vec<u32> = vec![5, 0, 7, 5];
        let g: Vec<Vec<f32>> = k
            .gather_rows_f32(&l, &Tensor::new(rows.as_slice(), dev)?)?
            .to_vec2()?;
        let wrong = rows
            .iter()
            .enumerate()
            .filter(|(j, r)| g[*j] != before[**r as usize])
            .count();
        t.check(
            "gather_rows_f32 4 of 8 rows (rows wrong)".to_string(),
            wrong as f32,
            0.0,
        );
    }
    qk_rope_checks(&k, dev, dt, t)?;
    for &(nh, nkv) in &[(16usize, 8usize), (32, 8), (16, 16), (8, 1)] {
        for (b, max_ctx, name) in [
            (1usize, 1usize, "ctx 1"),
            (1, 17, "ctx 17"),
            (1, 8000, "ctx 8000 (many splits)"),
            (3, 48, "block boundaries"),
            (8, 600, "ragged"),
            (64, 1024, "ragged"),
            (256, 600, "ragged"),
        ] {
            if (nh, nkv) != (16, 8) && b > 8 {
                continue;
            }
            let e = decode_check(&k, dev, dt, b, max_ctx, nh, nkv)?;
            t.check(
                format!("paged_decode {dt:?} B {b} {name} nh {nh} nkv {nkv}"),
                e,
                tol(dt),
            );
        }
    }
    Ok(())
}

fn qk_rope_checks(k: &CudaKernels, dev: &Device, dt: DType, t: &mut Table) -> Res<()> {
    let (nh, nkv, hd, theta) = (16usize, 8usize, 128usize, 1_000_000f64);
    let inv: Vec<f32> = (0..hd)
        .step_by(2)
        .map(|i| 1f32 / theta.powf(i as f64 / hd as f64) as f32)
        .collect();
    let inv_t = Tensor::new(inv.as_slice(), dev)?;
    for &tokens in &[1usize, 17, 512] {
        let slots_total = 4096;
        let qkv = randn(&[tokens, (nh + 2 * nkv) * hd], dt, dev)?;
        let qw = randn(&[hd], dt, dev)?.affine(0.1, 1.0)?;
        let kw = randn(&[hd], dt, dev)?.affine(0.1, 1.0)?;
        let positions: Vec<u32> = (0..tokens as u32).map(|i| (i * 37 + 5) % 8000).collect();
        let slots: Vec<u32> = (0..tokens as u32)
            .map(|i| (i * 7 + 3) % slots_total as u32)
            .collect();
        let kc = Tensor::zeros((nkv, slots_total, hd), dt, dev)?;
        let vc = Tensor::zeros((nkv, slots_total, hd), dt, dev)?;
        let q = k.qk_norm_rope_kv_write(
            &qkv,
            &qw,
            &kw,
            &inv_t,
            &Tensor::new(positions.as_slice(), dev)?,
            &Tensor::new(slots.as_slice(), dev)?,
            KvRef::plain(&kc, &vc),
            (nh, nkv, hd),
            1e-6,
        )?;
        // Reference in f32: rms_norm, then rotate-half RoPE with f32 cos/sin.
        let f = |x: &Tensor| x.to_dtype(DType::F32);
        let pos_f: Vec<f32> = positions.iter().map(|&p| p as f32).collect();
        let freqs = Tensor::new(pos_f.as_slice(), dev)?
            .reshape((tokens, 1))?
            .matmul(&inv_t.reshape((1, hd / 2))?)?;
        let (cos, sin) = (freqs.cos()?, freqs.sin()?);
        let rope = |x: &Tensor, heads: usize, w: &Tensor| -> Res<Tensor> {
            let x = candle_nn::ops::rms_norm(
                &x.reshape((tokens, heads, hd))?.contiguous()?,
                &f(w)?,
                1e-6,
            )?;
            Ok(candle_nn::rotary_emb::rope(
                &x.unsqueeze(2)?.contiguous()?,
                &cos.unsqueeze(1)?.contiguous()?,
                &sin.unsqueeze(1)?.contiguous()?,
            )?
            .squeeze(2)?)
        };
        let qkv32 = f(&qkv)?;
        let q_ref = rope(&qkv32.narrow(1, 0, nh * hd)?, nh, &qw)?;
        let k_ref = rope(&qkv32.narrow(1, nh * hd, nkv * hd)?, nkv, &kw)?;
        let v_ref = qkv32
            .narrow(1, (nh + nkv) * hd, nkv * hd)?
            .reshape((tokens, nkv, hd))?;
        let idx = Tensor::new(slots.as_slice(), dev)?;
        let k_got = kc.index_select(&idx, 1)?.transpose(0, 1)?;
        let v_got = vc.index_select(&idx, 1)?.transpose(0, 1)?;
        t.check(
            format!("qk_norm_rope {dt:?} T {tokens} (q)"),
            rel(&q, &q_ref)?,
            tol(dt),
        );
        t.check(
            format!("qk_norm_rope {dt:?} T {tokens} (k in cache)"),
            rel(&k_got, &k_ref)?,
            tol(dt),
        );
        t.check(
            format!("qk_norm_rope {dt:?} T {tokens} (v in cache)"),
            rel(&v_got, &v_ref)?,
            0.0,
        );
    }
    Ok(())
}

/// Ragged contexts in [1, max_ctx] (the first sequence gets max_ctx), shuffled blocks.
fn decode_check(
    k: &CudaKernels,
    dev: &Device,
    dt: DType,
    b: usize,
    max_ctx: usize,
    nh: usize,
    nkv: usize,
) -> Res<f32> {
    let (hd, bs) = (128usize, 16usize);
    let ctx: Vec<usize> = (0..b)
        .map(|i| {
            if i == 0 {
                max_ctx
            } else {
                1 + (i * 7919 + 13) % max_ctx
            }
        })
        .collect();
    let need: Vec<usize> = ctx.iter().map(|c| c.div_ceil(bs)).collect();
    let total: usize = need.iter().sum::<usize>() + 3;
    // A permutation of the blocks (a multiplicative walk), so tables are not contiguous.
    let perm: Vec<u32> = (0..total).map(|i| ((i * 7 + 1) % total) as u32).collect();
    let mut tables = Vec::new();
    let mut next = 0;
    for n in &need {
        tables.push(perm[next..next + n].to_vec());
        next += n;
    }
    let w = need.iter().copied().max().unwrap_or(1);
    let mut flat = Vec::new();
    for tb in &tables {
        flat.extend_from_slice(tb);
        flat.extend(std::iter::repeat_n(0u32, w - tb.len()));
    }
    let kc = randn(&[nkv, total * bs, hd], dt, dev)?;
    let vc = randn(&[nkv, total * bs, hd], dt, dev)?;
    let q = (randn(&[b, nh, hd], dt, dev)? * (1.0 / (hd as f64).sqrt()))?.to_dtype(dt)?;
    let ctx_u: Vec<u32> = ctx.iter().map(|&c| c as u32).collect();
    let out = k.paged_decode(
        &q,
        KvRef::plain(&kc, &vc),
        &Tensor::from_vec(flat, (b, w), dev)?,
        &Tensor::new(ctx_u.as_slice(), dev)?,
        bs,
    )?;
    let g = nh / nkv;
    let mut worst = 0f32;
    for i in 0..b {
        let slots: Vec<u32> = (0..ctx[i])
            .map(|p| tables[i][p / bs] * bs as u32 + (p % bs) as u32)
            .collect();
        let idx = Tensor::new(slots.as_slice(), dev)?;
        let kk = kc.index_select(&idx, 1)?.to_dtype(DType::F32)?; // [nkv, c, hd]
        let vv = vc.index_select(&idx, 1)?.to_dtype(DType::F32)?;
        let qi = q.i(i)?.to_dtype(DType::F32)?.reshape((nkv, g, hd))?;
        let p = candle_nn::ops::softmax_last_dim(&qi.matmul(&kk.transpose(1, 2)?)?)?;
        let o = p.matmul(&vv)?.reshape(nh * hd)?;
        worst = worst.max(rel(&out.i(i)?, &o)?);
    }
    Ok(worst)
}

/// The device argmax against candle's on random logits (1, 64, 256 rows of a vocabulary) and
/// against the host's lowest-index argmax on rows full of exact ties, n a multiple of 4
/// (float4 reads) and not.
pub(super) fn argmax_checks(k: &CudaKernels, dev: &Device, t: &mut Table) -> Res<()> {
    for &rows in &[1usize, 64, 256] {
        let l = randn(&[rows, 151_936], DType::F32, dev)?;
        let ours: Vec<u32> = k.argmax(&l)?.to_vec1()?;
        let theirs: Vec<u32> = l.argmax(D::Minus1)?.to_vec1()?;
        let wrong = ours.iter().zip(&theirs).filter(|(a, b)| a != b).count();
        t.check(
            format!("argmax f32 rows {rows} x 151936 (rows wrong)"),
            wrong as f32,
            0.0,
        );
    }
    // Many exact ties (values rounded to 0.5): the lowest index of the maximum wins, over
    // rows in parts read as float4 (n a multiple of 4) and read one entry at a time (not).
    for &(rows, n) in &[
        (1usize, 151_936usize),
        (3, 151_935),
        (8, 40_004),
        (1, 32_769),
    ] {
        let l = (randn(&[rows, n], DType::F32, dev)? * 2.0)?
            .round()?
            .affine(0.5, 0.0)?;
        let ours: Vec<u32> = k.argmax(&l)?.to_vec1()?;
        let host: Vec<Vec<f32>> = l.to_vec2()?;
        let wrong = host
            .iter()
            .zip(&ours)
            .filter(|(row, o)| {
                let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                row.iter().position(|&v| v == best) != Some(**o as usize)
            })
            .count();
        t.check(
            format!("argmax f32 rows {rows} x {n}, ties to the lowest index (rows wrong)"),
            wrong as f32,
            0.0,
        );
    }
    Ok(())
}
