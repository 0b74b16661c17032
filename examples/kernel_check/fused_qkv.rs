//! The 1-row fused decode attention with the qkv matmul inside (`decode_fused_qkv_into`,
//! `LaunchOptions::fused_qkv`) against the two launches it replaces, the skinny matmul's
//! add + RMSNorm + qkv (`norm_linear_into`) and the fused attention (`decode_fused_into`):
//! the attention output, the written K/V rows and the residual sum must be the same bits,
//! and the merge counters zero after every launch. Then the engine: one sequence's greedy
//! tokens with `--fused-qkv` equal the defaults', with graphs and without.

use candle_core::{DType, Device, Tensor};
use policy_serve::engine::cuda::{CudaKernels, LaunchOptions};
use policy_serve::engine::kv_format::{KvRef, KvScale, quantize};
use policy_serve::engine::{DTypeChoice, DeviceChoice};
use policy_serve::testing::synthetic_prompt;
use policy_serve::{EngineOptions, GenerationRequest};

use super::{Args, Res, Table, engine, randn, tokens_of};

/// One case: a 1-row step over a context of `ctx` tokens (at most 16 x 128), `nh` / `nkv`
/// heads of 128 over a hidden size `kin`, a delta added to the residual or not (a model's
/// first layer), bf16 or fp8 caches. Returns the worst differences of the attention output,
/// the caches and the residual sum, and the counters left.
fn case(
    k: &CudaKernels,
    dev: &Device,
    (ctx, nh, nkv, kin): (usize, usize, usize, usize),
    add: bool,
    fp8: Option<KvScale>,
) -> Res<[f32; 4]> {
    let (hd, bs, dt) = (128usize, 16usize, DType::BF16);
    let blocks = ctx.div_ceil(bs);
    // The row's blocks in reverse order (a table that is not contiguous), two spare.
    let table: Vec<u32> = (0..blocks as u32).rev().map(|j| j + 2).collect();
    let slot = table[(ctx - 1) / bs] * bs as u32 + ((ctx - 1) % bs) as u32;
    let tables = Tensor::from_vec(table.clone(), (1, blocks), dev)?;
    let width = Tensor::new(&[blocks as u32], dev)?;
    let ctx_t = Tensor::new(&[ctx as u32], dev)?;
    let pos = Tensor::new(&[ctx as u32 - 1], dev)?;
    let slots = Tensor::new(&[slot], dev)?;
    let inv = super::fused::inv_freq(hd, dev)?;
    let scale = 1.0 / (kin as f64).sqrt();
    let w = (randn(&[(nh + 2 * nkv) * hd, kin], DType::F32, dev)? * scale)?.to_dtype(dt)?;
    let res = randn(&[1, kin], dt, dev)?;
    let delta = randn(&[1, kin], dt, dev)?;
    let nw = randn(&[kin], dt, dev)?.affine(0.1, 1.0)?;
    let qw =
        (randn(&[hd], dt, dev)?.affine(0.1, 1.0)? * (1.0 / (hd as f64).sqrt()))?.to_dtype(dt)?;
    let kw = randn(&[hd], dt, dev)?.affine(0.1, 1.0)?;
    let total = (blocks + 3) * bs;
    let (mut kc0, mut vc0) = (
        randn(&[nkv, total, hd], dt, dev)?,
        randn(&[nkv, total, hd], dt, dev)?,
    );
    let scale = fp8.unwrap_or(KvScale::ONE);
    if fp8.is_some() {
        kc0 = quantize(&kc0, scale.k)?;
        vc0 = quantize(&vc0, scale.v)?;
    }
    let splits = 16;
    let part = CudaKernels::decode_partition(1);
    let scratch = k.decode_scratch(1, nh, splits)?;
    let counters = k.decode_counters(1, nh)?;
    let d = add.then_some(&delta);
    fn kv<'a>(k: &'a Tensor, v: &'a Tensor, scale: KvScale) -> KvRef<'a> {
        KvRef {
            k,
            v,
            scale,
            fresh: None,
        }
    }
    // The two launches.
    let (kc1, vc1) = (kc0.copy()?, vc0.copy()?);
    let (h, qkv, ro1) = (
        Tensor::zeros((1, kin), dt, dev)?,
        Tensor::zeros((1, (nh + 2 * nkv) * hd), dt, dev)?,
        Tensor::zeros((1, kin), dt, dev)?,
    );
    k.norm_linear_into((&res, d, &ro1), (&nw, 1e-6), &h, &w, &qkv, None, None)?;
    let out1 = Tensor::zeros((1, nh * hd), dt, dev)?;
    k.decode_fused_into(
        &qkv,
        (&qw, &kw, 1e-6),
        &inv,
        (&pos, &slots),
        kv(&kc1, &vc1, scale),
        (&tables, Some(&width)),
        &ctx_t,
        bs,
        &out1,
        (splits, part, scratch.as_ref(), &counters),
        true,
    )?;
    // One, twice (the second launch finds the counters the first left).
    let (kc2, vc2) = (kc0.copy()?, vc0.copy()?);
    let mut worst = [0f32; 4];
    for _ in 0..2 {
        let out2 = Tensor::ones((1, nh * hd), dt, dev)?;
        let ro2 = Tensor::ones((1, kin), dt, dev)?;
        k.decode_fused_qkv_into(
            (&res, d, &ro2),
            (&nw, 1e-6),
            &w,
            (&qw, &kw, 1e-6),
            &inv,
            (&pos, &slots),
            kv(&kc2, &vc2, scale),
            (&tables, Some(&width)),
            &ctx_t,
            bs,
            &out2,
            (splits, part, scratch.as_ref(), &counters),
        )?;
        worst[0] = worst[0].max(diff(&out1, &out2)?);
        // Without a delta neither writes the residual sum.
        if add {
            worst[2] = worst[2].max(diff(&ro1, &ro2)?);
        }
    }
    worst[1] = diff(&kc1, &kc2)?.max(diff(&vc1, &vc2)?);
    worst[3] = counters.sum_all()?.to_scalar::<u32>()? as f32;
    Ok(worst)
}

fn diff(a: &Tensor, b: &Tensor) -> Res<f32> {
    let d = (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?;
    Ok(d.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

/// The kernel checks (sm_90; elsewhere the kernels are refused at load, and nothing runs).
pub fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let o = LaunchOptions {
        fused_qkv: true,
        ..LaunchOptions::default()
    };
    let k = match CudaKernels::new(dev, DType::BF16, &o) {
        Ok(Some(k)) => k,
        Ok(None) => return Err("no kernels".into()),
        Err(e) => {
            println!("fused qkv: not checked ({e})");
            return Ok(());
        }
    };
    let fp8 = KvScale { k: 0.05, v: 0.03 };
    // 0.6B's shape (1,024 inputs: the deferred norm) and 1.7B's (2,048: the norm on the
    // inputs); contexts of one token, a ragged one, 600, and one cluster's whole 2,048.
    for &(ctx, nh, nkv, kin) in &[
        (600, 16, 8, 1024),
        (1, 16, 8, 1024),
        (37, 16, 8, 1024),
        (2048, 16, 8, 1024),
        (600, 16, 8, 2048),
        (2048, 16, 8, 2048),
    ] {
        for (add, f8) in [(true, None), (false, None), (true, Some(fp8))] {
            let [out, cache, ro, left] = case(&k, dev, (ctx, nh, nkv, kin), add, f8)?;
            let name = format!(
                "decode_fused_qkv ctx {ctx} nh {nh} nkv {nkv} k {kin}{}{}",
                if add { "" } else { " no delta" },
                if f8.is_some() { " fp8" } else { "" }
            );
            t.check(format!("{name} (out = two launches, bits)"), out, 0.0);
            t.check(format!("{name} (K/V = two launches)"), cache, 0.0);
            t.check(format!("{name} (residual sum = two launches)"), ro, 0.0);
            t.check(format!("{name} (counters left)"), left, 0.0);
        }
    }
    Ok(())
}

/// The engine with `--fused-qkv` on the checked model: one sequence (every decode step one
/// row, contexts under 2,048) gives the defaults' greedy tokens, with graphs and eagerly.
pub fn engine_check(a: &Args, t: &mut Table) -> Res<()> {
    let run = |fused_qkv: bool, cuda_graphs: bool| -> Res<Vec<u32>> {
        let mut kernels = a.kernels.options();
        kernels.fused_qkv = fused_qkv;
        let opts = EngineOptions {
            device: DeviceChoice::Cuda(0),
            dtype: DTypeChoice::BF16,
            cuda_graphs,
            kernels,
            ..EngineOptions::default()
        };
        let (_r, e) = engine(a, opts)?;
        let mut req = GenerationRequest::new(synthetic_prompt(700, 7)).max_new_tokens(200);
        req.ignore_eos = true;
        Ok(tokens_of(&e, [req])?.remove(0))
    };
    let base = run(false, true)?;
    for graphs in [true, false] {
        match run(true, graphs) {
            Ok(toks) => {
                let lead = toks.iter().zip(&base).take_while(|(x, y)| x == y).count();
                t.check(
                    format!("fused qkv engine, graphs {graphs}: 200 greedy tokens = defaults' (tokens differing)"),
                    (base.len().max(toks.len()) - lead) as f32,
                    0.0,
                );
            }
            Err(e) => println!("fused qkv engine: not checked ({e})"),
        }
    }
    Ok(())
}
