//! The tensor-core decode attention (`kernels/decode_mma.cu`, `LaunchOptions::mma_decode`)
//! against an f32 reference of the attention on the dequantized caches and against the
//! CUDA-core kernel (`kernels/decode.cu`): bf16 and fp8 caches (power-of-two and calibration-
//! like scales), every GQA group, ragged contexts (one empty), block sizes 16, 8 and 32 (8 takes the
//! per-token slot path), a partition count fixed below what the contexts need (a captured
//! graph's: partitions grow), every stage count. Then both timed on the bench's contexts.
//! A kernel that ignores a scale, pairs q's dims unlike the keys', puts a value column in the
//! wrong output dim or lets a token past the context in fails the f32 comparison. Each kernel
//! is also held to the f32 reference rounded to bf16 in the norm of the difference (<= 1e-3
//! over fp8 caches, the bound: what the kernel adds beyond its output's rounding).

use candle_core::{DType, Device, IndexOp, Tensor};
use policy_serve::engine::cuda::{CudaKernels, LaunchOptions};
use policy_serve::engine::kv_format::{KvRef, KvScale, dequantize, quantize};

use super::{Args, Res, Table, engine, randn, rel, tokens_of};
use policy_serve::engine::{DTypeChoice, DeviceChoice, KvCacheDtype};
use policy_serve::testing::synthetic_prompt;
use policy_serve::{EngineOptions, GenerationRequest};

/// Caches, tables and queries of `b` decode sequences.
struct Setup {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: KvScale,
    tables: Tensor,
    ctx_t: Tensor,
    ctx: Vec<usize>,
    table_rows: Vec<Vec<u32>>,
    bs: usize,
    w: usize,
    nkv: usize,
}

/// Contexts ragged up to `max_ctx` (or all `max_ctx` with `uniform`); each sequence's blocks
/// in reverse order. `fp8`: the caches quantized with those scales.
fn setup(
    dev: &Device,
    (b, max_ctx, uniform): (usize, usize, bool),
    (nh, nkv, bs): (usize, usize, usize),
    fp8: Option<KvScale>,
) -> Res<Setup> {
    let hd = 128usize;
    let ctx: Vec<usize> = (0..b)
        .map(|i| {
            if uniform {
                max_ctx
            } else if i + 1 == b && b > 2 {
                0
            } else {
                1 + (i * 7919 + max_ctx - 1) % max_ctx
            }
        })
        .collect();
    let need: Vec<usize> = ctx.iter().map(|c| c.div_ceil(bs)).collect();
    let w = need.iter().copied().max().unwrap_or(1).max(1);
    let (mut flat, mut table_rows, mut next) = (Vec::new(), Vec::new(), 0u32);
    for n in &need {
        let tb: Vec<u32> = (0..*n as u32).rev().map(|j| next + j).collect();
        next += *n as u32;
        flat.extend_from_slice(&tb);
        flat.extend(std::iter::repeat_n(0u32, w - tb.len()));
        table_rows.push(tb);
    }
    let slots = (next as usize + 2) * bs;
    let scale = fp8.unwrap_or(KvScale::ONE);
    let (k, v) = match fp8 {
        Some(s) => {
            // Magnitudes around the scales' range (some saturate at ±448 · scale).
            let k = (randn(&[nkv, slots, hd], DType::F32, dev)? * (120.0 * s.k as f64))?;
            let v = (randn(&[nkv, slots, hd], DType::F32, dev)? * (120.0 * s.v as f64))?;
            (quantize(&k, s.k)?, quantize(&v, s.v)?)
        }
        None => (
            randn(&[nkv, slots, hd], DType::BF16, dev)?,
            randn(&[nkv, slots, hd], DType::BF16, dev)?,
        ),
    };
    let q = (randn(&[b, nh, hd], DType::BF16, dev)? * (1.0 / (hd as f64).sqrt()))?
        .to_dtype(DType::BF16)?;
    let ctx_u: Vec<u32> = ctx.iter().map(|&c| c as u32).collect();
    Ok(Setup {
        q,
        k,
        v,
        scale,
        tables: Tensor::from_vec(flat, (b, w), dev)?,
        ctx_t: Tensor::new(ctx_u.as_slice(), dev)?,
        ctx,
        table_rows,
        bs,
        w,
        nkv,
    })
}

impl Setup {
    fn kv(&self) -> KvRef<'_> {
        KvRef {
            scale: self.scale,
            ..KvRef::plain(&self.k, &self.v)
        }
    }

    /// The attention in f32 on the dequantized caches, sequence by sequence.
    fn reference(&self, dev: &Device) -> Res<Tensor> {
        let (b, nh, hd) = self.q.dims3()?;
        let g = nh / self.nkv;
        let deq = |c: &Tensor, s: f32| -> Res<Tensor> {
            Ok(if c.dtype() == DType::BF16 {
                c.to_dtype(DType::F32)?
            } else {
                dequantize(c, s, DType::F32)?
            })
        };
        let mut rows = Vec::with_capacity(b);
        for i in 0..b {
            let slots: Vec<u32> = (0..self.ctx[i])
                .map(|p| self.table_rows[i][p / self.bs] * self.bs as u32 + (p % self.bs) as u32)
                .collect();
            let qi = self
                .q
                .i(i)?
                .to_dtype(DType::F32)?
                .reshape((self.nkv, g, hd))?;
            if slots.is_empty() {
                rows.push(Tensor::zeros(nh * hd, DType::F32, dev)?);
                continue;
            }
            let idx = Tensor::new(slots.as_slice(), dev)?;
            let kk = deq(&self.k.index_select(&idx, 1)?, self.scale.k)?;
            let vv = deq(&self.v.index_select(&idx, 1)?, self.scale.v)?;
            let p = candle_nn::ops::softmax_last_dim(&qi.matmul(&kk.transpose(1, 2)?)?)?;
            rows.push(p.matmul(&vv)?.reshape(nh * hd)?);
        }
        Ok(Tensor::stack(&rows, 0)?)
    }

    /// One launch (with its reduce) into `out`, in `splits` partitions (the engine's count for
    /// these tables when None).
    fn run(&self, k: &CudaKernels, out: &Tensor, splits: Option<usize>) -> Res<()> {
        let (b, nh, _) = self.q.dims3()?;
        let part = CudaKernels::decode_partition(b);
        let splits = splits.unwrap_or_else(|| CudaKernels::decode_splits(self.w, self.bs, part));
        let scratch = k.decode_scratch(b, nh, splits)?;
        k.paged_decode_into(
            &self.q,
            self.kv(),
            (&self.tables, None),
            &self.ctx_t,
            self.bs,
            out,
            (splits, part, scratch.as_ref()),
        )?;
        Ok(())
    }

    fn out(&self, dev: &Device) -> Res<Tensor> {
        let (b, nh, hd) = self.q.dims3()?;
        Ok(Tensor::zeros((b, nh * hd), DType::BF16, dev)?)
    }

    /// Bytes of K and V the sequences' contexts hold.
    fn kv_bytes(&self) -> f64 {
        let elem = if self.k.dtype() == DType::BF16 { 2 } else { 1 };
        (self.ctx.iter().sum::<usize>() * self.nkv * 128 * 2 * elem) as f64
    }
}

/// The kernels with the CUDA-core decode (None) or the tensor-core one of d stages (with P
/// as a bf16 pair over bf16 caches when `split`).
fn kernels(dev: &Device, mma: Option<u8>, split: bool) -> Res<CudaKernels> {
    let opts = LaunchOptions {
        mma_decode: mma.is_some(),
        mma_decode_stages: mma,
        mma_decode_split_p: split,
        ..LaunchOptions::default()
    };
    Ok(CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?)
}

/// The tensor-core kernels of 2, 3 and 4 stages: `[split P][stages - 2]`.
fn mma_kernels(dev: &Device) -> Res<Vec<Vec<CudaKernels>>> {
    [false, true]
        .into_iter()
        .map(|split| (2..=4).map(|d| kernels(dev, Some(d), split)).collect())
        .collect()
}

/// A check's caches: name, fp8 scales (None: bf16), the stage counts taken, whether P is a
/// bf16 pair, and the bound on the kernel's own error (the f32 reference rounded to bf16, in
/// the norm): the 1e-3, but 2.5e-3 for bf16 caches with P rounded to bf16 (1.8e-3 to
/// 2.2e-3 on the H200).
type Cache = (&'static str, Option<KvScale>, &'static [u8], bool, f32);
fn caches() -> [Cache; 4] {
    let pow2 = KvScale { k: 0.0625, v: 0.25 };
    [
        ("bf16", None, &[2, 3], false, 2.5e-3),
        ("bf16, P split", None, &[2, 3], true, 1e-3),
        ("fp8 pow2", Some(pow2), &[2, 3, 4], false, 1e-3),
        (
            "fp8 calibrated",
            Some(KvScale::from_amax(37.3, 5.9)),
            &[2, 3, 4],
            false,
            1e-3,
        ),
    ]
}

pub fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let cores = kernels(dev, None, false)?;
    if let Err(why) = cores.fp8_kv() {
        println!("mma decode checks skipped: {why}");
        return Ok(());
    }
    let mma = mma_kernels(dev)?;
    // (sequences, longest context, query heads, KV heads, block size, partitions)
    type Case = (usize, usize, usize, usize, usize, Option<usize>);
    let cases: &[Case] = &[
        (1, 600, 16, 8, 16, None),
        (3, 17, 16, 8, 16, None),
        (8, 3000, 16, 8, 16, None),
        (8, 3000, 16, 8, 16, Some(2)),
        (64, 1100, 16, 8, 16, None),
        (256, 700, 16, 8, 16, None),
        (20, 513, 32, 8, 16, None),
        (9, 300, 8, 8, 16, None),
        (5, 450, 64, 8, 16, Some(1)),
        (12, 333, 16, 8, 8, None),
        (12, 333, 16, 8, 32, None),
    ];
    for &(b, ctx, nh, nkv, bs, splits) in cases {
        for (name, fp8, depths, split, bound) in caches() {
            let s = setup(dev, (b, ctx, false), (nh, nkv, bs), fp8)?;
            let reference = s.reference(dev)?;
            let base = s.out(dev)?;
            s.run(&cores, &base, splits)?;
            let what = format!(
                "mma decode B {b} ctx {ctx} nh {nh} nkv {nkv} bs {bs} splits {splits:?} {name}"
            );
            // The reference rounded to bf16 as the kernels' outputs are: the norm of the
            // difference then measures the kernel's own error, not the output's rounding.
            let rounded = reference.to_dtype(DType::BF16)?;
            t.check(
                format!("{what}: CUDA-core kernel vs f32"),
                rel(&base, &reference)?,
                1e-2,
            );
            t.check(
                format!("{what}: CUDA-core kernel vs f32 in bf16 (norm)"),
                norm_rel(&base, &rounded)?,
                1e-3,
            );
            for &d in depths {
                let out = s.out(dev)?;
                s.run(&mma[split as usize][d as usize - 2], &out, splits)?;
                t.check(
                    format!("{what} {d} stages vs f32"),
                    rel(&out, &reference)?,
                    1e-2,
                );
                t.check(
                    format!("{what} {d} stages vs f32 in bf16 (norm)"),
                    norm_rel(&out, &rounded)?,
                    bound,
                );
                t.check(
                    format!("{what} {d} stages vs CUDA-core"),
                    rel(&out, &base)?,
                    1.5e-2,
                );
            }
        }
    }
    Ok(())
}

/// |a - b| / |b| over all elements (Euclidean norms).
fn norm_rel(a: &Tensor, b: &Tensor) -> Res<f32> {
    let a = a.to_dtype(DType::F32)?.flatten_all()?;
    let b = b.to_dtype(DType::F32)?.flatten_all()?;
    let d = (a - &b)?.sqr()?.sum_all()?.to_scalar::<f32>()?.sqrt();
    let n = b.sqr()?.sum_all()?.to_scalar::<f32>()?.sqrt();
    Ok(d / n.max(1e-12))
}

/// Microseconds a launch (with its reduce), 50 back to back between two events.
fn time(k: &CudaKernels, s: &Setup, out: &Tensor) -> Res<f64> {
    s.run(k, out, None)?;
    let t0 = k.event()?;
    for _ in 0..50 {
        s.run(k, out, None)?;
    }
    Ok(k.event()?.ms_since(&t0) * 20.0)
}

/// The CUDA-core and tensor-core kernels on the bench's shapes (0.6B / 1.7B: 16 query heads,
/// 8 KV heads; every context 576 tokens, as 512-token prompts 64 tokens into their answers).
pub fn timings(dev: &Device) -> Res<()> {
    let cores = kernels(dev, None, false)?;
    if cores.fp8_kv().is_err() {
        return Ok(());
    }
    let mma = mma_kernels(dev)?;
    println!("| cache | batch | context | CUDA cores us (TB/s) | mma d2 | mma d3 | mma d4 |");
    println!("|---|---|---|---|---|---|---|");
    for (name, fp8, depths, split, _) in caches().into_iter().filter(|c| c.0 != "fp8 pow2") {
        for (b, ctx) in [(64, 576), (256, 576), (512, 576), (256, 2048), (32, 8192)] {
            let s = setup(dev, (b, ctx, true), (16, 8, 16), fp8)?;
            let out = s.out(dev)?;
            let cell = |us: f64| format!("{us:.1} ({:.2})", s.kv_bytes() / us / 1e6);
            let mut row = format!(
                "| {name} | {b} | {ctx} | {} |",
                cell(time(&cores, &s, &out)?)
            );
            for d in 2..=4u8 {
                if depths.contains(&d) {
                    row += &format!(
                        " {} |",
                        cell(time(&mma[split as usize][d as usize - 2], &s, &out)?)
                    );
                } else {
                    row += " - |";
                }
            }
            println!("{row}");
        }
    }
    Ok(())
}

/// The engine end to end with the tensor-core decode (3 stages) against the CUDA-core kernel:
/// 32 ragged greedy sequences of 48 tokens (more than the fused decode takes, so every decode
/// step runs the unfused attention), bf16 and fp8 KV, CUDA graphs on; and graphs = eager with
/// it. The share of tokens before each sequence's first divergence is checked (>= 90%: both
/// kernels round differently, a near tie may flip; a kernel that attends wrongly diverges at
/// once).
pub fn engine_check(a: &Args, t: &mut Table) -> Res<()> {
    let n = 48usize;
    let run = |kv_dtype: KvCacheDtype, mma: Option<u8>, cuda_graphs: bool| -> Res<Vec<Vec<u32>>> {
        let mut kernels = a.kernels.options();
        kernels.mma_decode = mma.is_some();
        kernels.mma_decode_stages = mma;
        let opts = EngineOptions {
            device: DeviceChoice::Cuda(0),
            dtype: DTypeChoice::BF16,
            kv_dtype,
            cuda_graphs,
            kernels,
            speculative: None,
            ..EngineOptions::default()
        };
        let (_r, e) = engine(a, opts)?;
        let requests = (0..32).map(|i| {
            let mut req =
                GenerationRequest::new(synthetic_prompt(20 + i * 37, 900 + i)).max_new_tokens(n);
            req.ignore_eos = true;
            req
        });
        tokens_of(&e, requests)
    };
    let lead = |x: &[u32], y: &[u32]| x.iter().zip(y).take_while(|(a, b)| a == b).count();
    for (name, kv) in [("bf16", KvCacheDtype::Auto), ("fp8", KvCacheDtype::Fp8)] {
        let cores = run(kv, None, true)?;
        let mma = run(kv, Some(3), true)?;
        let eager = run(kv, Some(3), false)?;
        let same: usize = cores.iter().zip(&mma).map(|(c, m)| lead(c, m)).sum();
        let share = same as f32 / (32 * n) as f32;
        println!(
            "mma decode engine {name} KV: {same} of {} tokens before divergence",
            32 * n
        );
        t.check(
            format!("mma decode engine {name} KV: 32 x {n} greedy, 1 - share equal to CUDA-core"),
            1.0 - share,
            0.1,
        );
        let differ = mma.iter().zip(&eager).filter(|(g, e)| g != e).count();
        t.check(
            format!("mma decode engine {name} KV: graphs = eager (sequences differing)"),
            differ as f32,
            0.0,
        );
    }
    Ok(())
}
