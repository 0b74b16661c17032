//! fp8 (e4m3) KV caches: every kernel that writes or reads one against a dequantized
//! reference. With power-of-two scales the dequantized values are exact in bf16 and folding
//! K's scale into q is exact, so the fp8 kernels must give the bits of the bf16 kernels run on
//! the dequantized caches (≤ 1e-3 relative is the bound; 0 is what holds). With other
//! scales the decode kernels are held against an f32 reference at bf16's tolerance, and the
//! prefill (which dequantizes into bf16 tiles as the reference does) still to the bit. A
//! kernel that ignores a scale fails every check here (the scales are far from 1).

use candle_core::{DType, Device, IndexOp, Tensor};
use policy_serve::engine::cuda::CudaKernels;
use policy_serve::engine::kv_format::{
    FP8_E4M3_MAX, FP8_STORAGE, KvRef, KvScale, dequantize, quantize,
};

use super::fused::{case, division_kernels, mma_kernels};
use super::{Args, Res, Table, cores, engine, randn, rel, tokens_of};
use policy_serve::engine::{DTypeChoice, DeviceChoice, KvCacheDtype};
use policy_serve::testing::synthetic_prompt;
use policy_serve::{EngineOptions, GenerationRequest};

/// Random caches `[nkv, slots, 128]` in fp8 with `scale`, and the same values dequantized to
/// bf16 (the reference's caches).
fn caches(
    dev: &Device,
    (nkv, slots): (usize, usize),
    scale: KvScale,
) -> Res<(Tensor, Tensor, Tensor, Tensor)> {
    // Magnitudes around the scales' range (some saturate at ±448 · scale).
    let k = (randn(&[nkv, slots, 128], DType::F32, dev)? * (120.0 * scale.k as f64))?;
    let v = (randn(&[nkv, slots, 128], DType::F32, dev)? * (120.0 * scale.v as f64))?;
    let (k8, v8) = (quantize(&k, scale.k)?, quantize(&v, scale.v)?);
    let kb = dequantize(&k8, scale.k, DType::BF16)?;
    let vb = dequantize(&v8, scale.v, DType::BF16)?;
    Ok((k8, v8, kb, vb))
}

/// Decode over fp8 caches against (a) the bf16 kernel on the dequantized caches and (b) an f32
/// reference; `b` sequences of ragged contexts up to `max_ctx`.
fn decode(
    k: &CudaKernels,
    dev: &Device,
    (b, max_ctx): (usize, usize),
    (nh, nkv): (usize, usize),
    scale: KvScale,
) -> Res<(f32, f32)> {
    let (hd, bs) = (128usize, 16usize);
    let ctx: Vec<usize> = (0..b)
        .map(|i| 1 + (i * 7919 + max_ctx - 1) % max_ctx)
        .collect();
    let need: Vec<usize> = ctx.iter().map(|c| c.div_ceil(bs)).collect();
    let total = need.iter().sum::<usize>() + 2;
    let w = need.iter().copied().max().unwrap_or(1);
    let (mut flat, mut tables, mut next) = (Vec::new(), Vec::new(), 0u32);
    for n in &need {
        let tb: Vec<u32> = (0..*n as u32).rev().map(|j| next + j).collect();
        next += *n as u32;
        flat.extend_from_slice(&tb);
        flat.extend(std::iter::repeat_n(0u32, w - tb.len()));
        tables.push(tb);
    }
    let (k8, v8, kb, vb) = caches(dev, (nkv, total * bs), scale)?;
    let q = (randn(&[b, nh, hd], DType::BF16, dev)? * (1.0 / (hd as f64).sqrt()))?
        .to_dtype(DType::BF16)?;
    let tables_t = Tensor::from_vec(flat, (b, w), dev)?;
    let ctx_u: Vec<u32> = ctx.iter().map(|&c| c as u32).collect();
    let ctx_t = Tensor::new(ctx_u.as_slice(), dev)?;
    let fp8 = KvRef {
        k: &k8,
        v: &v8,
        scale,
        fresh: None,
    };
    let out = k.paged_decode(&q, fp8, &tables_t, &ctx_t, bs)?;
    let reference = k.paged_decode(&q, KvRef::plain(&kb, &vb), &tables_t, &ctx_t, bs)?;
    let vs_bf16 = rel(&out, &reference)?;
    let g = nh / nkv;
    let mut vs_f32 = 0f32;
    for i in 0..b {
        let slots: Vec<u32> = (0..ctx[i])
            .map(|p| tables[i][p / bs] * bs as u32 + (p % bs) as u32)
            .collect();
        let idx = Tensor::new(slots.as_slice(), dev)?;
        let kk = dequantize(&k8.index_select(&idx, 1)?, scale.k, DType::F32)?;
        let vv = dequantize(&v8.index_select(&idx, 1)?, scale.v, DType::F32)?;
        let qi = q.i(i)?.to_dtype(DType::F32)?.reshape((nkv, g, hd))?;
        let p = candle_nn::ops::softmax_last_dim(&qi.matmul(&kk.transpose(1, 2)?)?)?;
        vs_f32 = vs_f32.max(rel(&out.i(i)?, &p.matmul(&vv)?.reshape(nh * hd)?)?);
    }
    Ok((vs_bf16, vs_f32))
}

/// Flash prefill chunks `(q_len, ctx)` over fp8 caches against the bf16 flash kernel on the
/// dequantized caches; with `fresh`, the chunks' own keys and values come unrounded from
/// rows beside the cache (random bf16 values), and the reference's caches hold those values
/// at the chunks' slots.
fn prefill(
    k: &CudaKernels,
    dev: &Device,
    specs: &[(usize, usize)],
    (nh, nkv): (usize, usize),
    scale: KvScale,
    fresh: bool,
) -> Res<f32> {
    let (hd, bs, tile) = (128usize, 16usize, k.prefill_tile(nh / nkv));
    let blocks: usize = specs.iter().map(|(_, c)| c.div_ceil(bs)).sum::<usize>() + 1;
    let (k8, v8, kb, vb) = caches(dev, (nkv, blocks * bs), scale)?;
    let t: usize = specs.iter().map(|(q, _)| q).sum();
    let q = (randn(&[t, nh, hd], DType::BF16, dev)? * (1.0 / (hd as f64).sqrt()))?
        .to_dtype(DType::BF16)?;
    let (mut tiles, mut meta, mut tables) = (Vec::new(), Vec::new(), Vec::new());
    let (mut row, mut next) = (0usize, 0usize);
    for (si, &(ql, ctx)) in specs.iter().enumerate() {
        let n = ctx.div_ceil(bs);
        for q0 in (0..ql).step_by(tile) {
            tiles.extend([si as u32, q0 as u32]);
        }
        meta.extend([row as u32, ql as u32, ctx as u32, tables.len() as u32]);
        tables.extend((0..n).rev().map(|b| (next + b) as u32));
        next += n;
        row += ql;
    }
    // The chunks' slots, row by row (row r of the chunks is position ctx - q_len + i).
    let mut chunk_slots = Vec::with_capacity(t);
    for (si, &(ql, ctx)) in specs.iter().enumerate() {
        let first = meta[4 * si + 3] as usize;
        for i in 0..ql {
            let pos = ctx - ql + i;
            chunk_slots.push(tables[first + pos / bs] * bs as u32 + (pos % bs) as u32);
        }
    }
    let (tiles, meta, tables) = (
        Tensor::new(tiles.as_slice(), dev)?,
        Tensor::new(meta.as_slice(), dev)?,
        Tensor::new(tables.as_slice(), dev)?,
    );
    let new_k = (randn(&[t, nkv, hd], DType::F32, dev)? * (50.0 * scale.k as f64))?
        .to_dtype(DType::BF16)?;
    let new_v = (randn(&[t, nkv, hd], DType::F32, dev)? * (50.0 * scale.v as f64))?
        .to_dtype(DType::BF16)?;
    if fresh {
        // The reference sees the unrounded values at the chunks' slots.
        let idx = Tensor::new(chunk_slots.as_slice(), dev)?
            .reshape((1, t, 1))?
            .broadcast_as((nkv, t, hd))?
            .contiguous()?;
        kb.scatter_set(&idx, &new_k.transpose(0, 1)?.contiguous()?, 1)?;
        vb.scatter_set(&idx, &new_v.transpose(0, 1)?.contiguous()?, 1)?;
    }
    let keys = specs.iter().map(|s| s.1).max().unwrap_or(0);
    let run = |kv: KvRef<'_>| -> Res<Tensor> {
        let out = Tensor::zeros((t, nh * hd), DType::BF16, dev)?;
        k.paged_prefill_into(&q, kv, &tiles, &meta, &tables, bs, keys, &out)?;
        Ok(out)
    };
    let out = run(KvRef {
        k: &k8,
        v: &v8,
        scale,
        fresh: fresh.then_some((&new_k, &new_v)),
    })?;
    rel(&out, &run(KvRef::plain(&kb, &vb))?)
}

/// The KV write into fp8 caches: each stored value is the bf16 kernel's value over the scale,
/// saturated at ±448 and rounded to e4m3 (within half an e4m3 step of it, or one subnormal
/// step). Returns the worst |stored - expected| in units of that bound (≤ 1 passes) and how
/// many values saturated.
fn write(k: &CudaKernels, dev: &Device, tokens: usize, scale: KvScale) -> Res<(f32, usize)> {
    let (nh, nkv, hd, slots_total) = (16usize, 8usize, 128usize, 2048usize);
    let inv: Vec<f32> = (0..hd)
        .step_by(2)
        .map(|i| 1f32 / 1e6f64.powf(i as f64 / hd as f64) as f32)
        .collect();
    let inv = Tensor::new(inv.as_slice(), dev)?;
    let qkv =
        (randn(&[tokens, (nh + 2 * nkv) * hd], DType::F32, dev)? * 3.0)?.to_dtype(DType::BF16)?;
    let qw = randn(&[hd], DType::BF16, dev)?.affine(0.1, 1.0)?;
    let kw = randn(&[hd], DType::BF16, dev)?.affine(0.5, 2.0)?;
    let pos: Vec<u32> = (0..tokens as u32).map(|i| (i * 37 + 5) % 8000).collect();
    let slots: Vec<u32> = (0..tokens as u32).map(|i| (i * 7 + 3) % 2048).collect();
    let (pos, slots_t) = (
        Tensor::new(pos.as_slice(), dev)?,
        Tensor::new(slots.as_slice(), dev)?,
    );
    let shape = (nkv, slots_total, hd);
    let (kb, vb) = (
        Tensor::zeros(shape, DType::BF16, dev)?,
        Tensor::zeros(shape, DType::BF16, dev)?,
    );
    let (k8, v8) = (
        Tensor::zeros(shape, FP8_STORAGE, dev)?,
        Tensor::zeros(shape, FP8_STORAGE, dev)?,
    );
    for kv in [
        KvRef::plain(&kb, &vb),
        KvRef {
            k: &k8,
            v: &v8,
            scale,
            fresh: None,
        },
    ] {
        k.qk_norm_rope_kv_write(
            &qkv,
            &qw,
            &kw,
            &inv,
            &pos,
            &slots_t,
            kv,
            (nh, nkv, hd),
            1e-6,
        )?;
    }
    let mut worst = 0f32;
    let mut saturated = 0usize;
    for (c8, cb, s) in [(&k8, &kb, scale.k), (&v8, &vb, scale.v)] {
        let got: Vec<f32> = dequantize(c8, s, DType::F32)?.flatten_all()?.to_vec1()?;
        let want: Vec<f32> = cb.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let top = FP8_E4M3_MAX * s;
        for (g, w) in got.iter().zip(&want) {
            let clamped = w.clamp(-top, top);
            saturated += usize::from(w.abs() > top);
            let bound = clamped.abs() / 16.0 + s * 2f32.powi(-9) + 1e-12;
            worst = worst.max((g - clamped).abs() / bound);
        }
    }
    Ok((worst, saturated))
}

pub fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let k = CudaKernels::new(dev, DType::BF16, &cores())?.ok_or("no kernels")?;
    if let Err(why) = k.fp8_kv() {
        println!("fp8 KV checks skipped: {why}");
        return Ok(());
    }
    // Power-of-two scales (exact dequantization) and calibration-like ones.
    let pow2 = KvScale { k: 0.0625, v: 0.25 };
    let odd = KvScale::from_amax(37.3, 5.9);
    for (tokens, s) in [
        (17, pow2),
        (512, odd),
        (
            64,
            KvScale {
                k: 1.0 / 448.0,
                v: 0.004,
            },
        ),
    ] {
        let (worst, sat) = write(&k, dev, tokens, s)?;
        t.check(
            format!("fp8 KV write, {tokens} tokens, scales {s:?} ({sat} saturated; in half-steps)"),
            worst,
            1.0 + 1e-3,
        );
    }
    for &(rows, heads) in &[
        ((1, 600), (16, 8)),
        ((8, 3000), (16, 8)),
        ((64, 1100), (16, 8)),
        ((256, 700), (32, 8)),
    ] {
        for (name, s) in [("pow2", pow2), ("calibrated", odd)] {
            let (vs_bf16, vs_f32) = decode(&k, dev, rows, heads, s)?;
            let what = format!(
                "fp8 decode B {} ctx {} nh {} nkv {} ({name} scales)",
                rows.0, rows.1, heads.0, heads.1
            );
            if name == "pow2" {
                t.check(
                    format!("{what} = bf16 kernel on dequantized"),
                    vs_bf16,
                    1e-3,
                );
            }
            t.check(format!("{what} vs f32 reference"), vs_f32, 1e-2);
        }
    }
    // The default fused kernel (lean) and the one with the table index by division
    // (`LaunchOptions::fused_lean` off).
    let kd = division_kernels(dev)?;
    // And the tensor-core loop (`LaunchOptions::fused_mma`) against the unfused tensor-core
    // kernels over fp8 (f16 MMAs).
    let km = mma_kernels(dev, 2)?;
    for &(rows, heads, splits) in &[
        ((1, 600, false), (16, 8), Some(32)),
        ((4, 3000, true), (16, 8), Some(32)),
        ((8, 700, true), (32, 8), Some(16)),
        ((16, 900, false), (16, 8), None),
    ] {
        for ((kf, kc, how), s) in [(&k, &k, ""), (&kd, &kd, " division"), (&km, &k, " mma2")]
            .into_iter()
            .flat_map(|k| [(k, pow2), (k, odd)])
        {
            let (out, cache, left, exact) = case((kf, kc), dev, rows, heads, splits, Some(s))?;
            let name = format!(
                "fp8 decode_fused{how} B {} ctx {} nh {} nkv {} scales {s:?}",
                rows.0, rows.1, heads.0, heads.1
            );
            t.check(
                format!("{name} (out = fp8 unfused)"),
                out,
                if exact { 0.0 } else { 1e-2 },
            );
            t.check(format!("{name} (K/V = fp8 unfused)"), cache, 0.0);
            t.check(format!("{name} (counters left)"), left as f32, 0.0);
        }
    }
    let specs: &[&[(usize, usize)]] = &[
        &[(200, 200)],
        &[(4096, 4096)],
        &[(64, 8192), (1, 300), (130, 1000)],
        &[(16, 32768)],
    ];
    for spec in specs {
        for (name, s) in [("pow2", pow2), ("calibrated", odd)] {
            let d = prefill(&k, dev, spec, (16, 8), s, false)?;
            t.check(
                format!("fp8 flash prefill {spec:?} ({name} scales) = bf16 on dequantized"),
                d,
                1e-3,
            );
        }
        let d = prefill(&k, dev, spec, (16, 8), odd, true)?;
        t.check(
            format!("fp8 flash prefill {spec:?}, the chunks' own K/V unrounded = bf16"),
            d,
            1e-3,
        );
    }
    Ok(())
}

/// The engine end to end over fp8 KV on the checked model: 8 ragged greedy sequences of 64
/// tokens, CUDA graphs (fused decode at this batch) against eager steps: the same tokens. The
/// agreement with bf16 KV is printed (fp8 rounding may change a greedy choice).
pub fn engine_check(a: &Args, t: &mut Table) -> Res<()> {
    let run = |kv_dtype: KvCacheDtype, cuda_graphs: bool| -> Res<Vec<Vec<u32>>> {
        let opts = EngineOptions {
            device: DeviceChoice::Cuda(0),
            dtype: DTypeChoice::BF16,
            kv_dtype,
            cuda_graphs,
            kernels: a.kernels.options(),
            ..EngineOptions::default()
        };
        let (_r, e) = engine(a, opts)?;
        let requests = (0..8).map(|i| {
            let mut req =
                GenerationRequest::new(synthetic_prompt(20 + i * 61, 500 + i)).max_new_tokens(64);
            req.ignore_eos = true;
            req
        });
        tokens_of(&e, requests)
    };
    let graphs = run(KvCacheDtype::Fp8, true)?;
    let eager = run(KvCacheDtype::Fp8, false)?;
    let bf16 = run(KvCacheDtype::Auto, true)?;
    let lead = |x: &[u32], y: &[u32]| x.iter().zip(y).take_while(|(a, b)| a == b).count();
    let differ = graphs.iter().zip(&eager).filter(|(g, e)| g != e).count();
    t.check(
        "fp8 KV engine: greedy 8 ragged x 64, graphs = eager (sequences differing)".to_string(),
        differ as f32,
        0.0,
    );
    for (i, (g, b)) in graphs.iter().zip(&bf16).enumerate() {
        println!(
            "fp8 vs bf16 KV seq {i}: {} of 64 tokens equal before the first divergence",
            lead(g, b)
        );
    }
    Ok(())
}
