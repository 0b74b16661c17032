//! The o fold (`LaunchOptions::fused_o`: the o projection inside the fused decode attention,
//! its per-KV-head f32 partials added by the gate|up norm) against the three launches it
//! replaces: the fused attention, the o matmul and the gate|up matmul behind the add+RMSNorm.
//! The attention's output and the cache must be the same bits; the partials' sum must match
//! o computed in f32 from that output (a block that took another block's rows or another head's
//! columns of o, or merged the cluster's partials in another order, fails it); the residual and
//! the SiLU product may differ from the unfolded path by the rounding of o's sum only.

use candle_core::{DType, Device, Tensor};
use policy_serve::engine::cuda::{CudaKernels, LaunchOptions, O_FOLD_PARTS};
use policy_serve::engine::kv_format::{KvRef, KvScale};

use super::fused::{Inputs, inputs};
use super::{Res, Table, randn, rel};

/// Kernels with the fused attention's tensor-core loop at `stages` a warp (the unfolded
/// path's) and the o fold (one stage, 1-row steps).
/// With `l2` the fold reads o's weights after the merge (`fused_o_l2`).
fn fold_kernels(dev: &Device, stages: u8, l2: bool) -> Res<CudaKernels> {
    let o = LaunchOptions {
        fused_mma: Some(stages),
        fused_mma_one: None,
        fused_o: true,
        fused_o_l2: l2,
        ..LaunchOptions::default()
    };
    Ok(CudaKernels::new(dev, DType::BF16, &o)?.ok_or("no kernels")?)
}

/// One case: `b` rows (row 1 a padding row when `pad`) after `ctx` tokens, 16 / 8 heads,
/// `hidden` / `inter` the MLP's widths. Returns the attention's and the caches' largest
/// difference, the partials' sum against f32 math, and the residual's and the SiLU product's
/// difference from the unfolded path (relative).
fn case(
    k: &CudaKernels,
    dev: &Device,
    (b, ctx, pad): (usize, usize, bool),
    (hidden, inter): (usize, usize),
    fp8: Option<KvScale>,
) -> Res<[f32; 5]> {
    let (nh, nkv, dt) = (16usize, 8usize, DType::BF16);
    let i = inputs(k, dev, (b, ctx, pad), (nh, nkv), None, fp8)?;
    let Inputs {
        qkv, qw, kw, inv, ..
    } = &i;
    let o_w = (randn(&[hidden, nh * 128], dt, dev)? * 0.02)?.to_dtype(dt)?;
    let gu_w = (randn(&[2 * inter, hidden], dt, dev)? * 0.02)?.to_dtype(dt)?;
    let nw = randn(&[hidden], dt, dev)?.affine(0.1, 1.0)?;
    let res = randn(&[b, hidden], dt, dev)?;
    let counters = k.decode_counters(b, nh)?;
    let run = |fold: Option<&Tensor>| -> Res<(Tensor, Tensor, Tensor, Tensor, Tensor)> {
        let (kc, vc) = (i.kc0.copy()?, i.vc0.copy()?);
        let kv = KvRef {
            k: &kc,
            v: &vc,
            scale: i.scale,
            fresh: None,
        };
        let out = Tensor::ones((b, nh * 128), dt, dev)?;
        let args = (&i.tables, Some(&i.width));
        let parts = (i.splits, i.part, i.scratch.as_ref(), &counters);
        let delta = match fold {
            Some(p) => {
                let (ps, norms) = ((&i.pos, &i.slots), (qw, kw, 1e-6));
                k.decode_fused_o_into(
                    qkv,
                    norms,
                    inv,
                    ps,
                    kv,
                    args,
                    &i.ctx,
                    16,
                    &out,
                    parts,
                    (&o_w, p),
                )?;
                p.clone()
            }
            None => {
                let (ps, norms) = ((&i.pos, &i.slots), (qw, kw, 1e-6));
                k.decode_fused_into(qkv, norms, inv, ps, kv, args, &i.ctx, 16, &out, parts, true)?;
                let o = Tensor::zeros((b, hidden), dt, dev)?;
                k.linear_into(&out, &o_w, &o)?;
                o
            }
        };
        let (res_out, h) = (
            Tensor::zeros((b, hidden), dt, dev)?,
            Tensor::zeros((b, hidden), dt, dev)?,
        );
        let (gu, act) = (
            Tensor::zeros((b, 2 * inter), dt, dev)?,
            Tensor::zeros((b, inter), dt, dev)?,
        );
        let r = (&res, Some(&delta), &res_out);
        k.norm_linear_into(r, (&nw, 1e-6), &h, &gu_w, &gu, Some((&gu, &act)), None)?;
        Ok((out, kc, vc, res_out, act))
    };
    let (out1, kc1, vc1, res1, act1) = run(None)?;
    let o_part = Tensor::full(f32::NAN, (b, O_FOLD_PARTS, hidden), dev)?;
    let (out2, kc2, vc2, res2, act2) = run(Some(&o_part))?;
    let diff = |a: &Tensor, b: &Tensor| -> Res<f32> {
        let d = (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?;
        Ok(d.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
    };
    // o in f32 on the CPU (no reduced-precision matmul) from the attention's output.
    let cpu = |x: &Tensor| -> Res<Tensor> { Ok(x.to_dtype(DType::F32)?.to_device(&Device::Cpu)?) };
    let exact = cpu(&out1)?.matmul(&cpu(&o_w)?.t()?)?;
    let folded = cpu(&o_part)?.sum(1)?;
    Ok([
        diff(&out1, &out2)?,
        diff(&kc1, &kc2)?.max(diff(&vc1, &vc2)?),
        rel(&folded, &exact)?,
        rel(&res2, &res1)?,
        rel(&act2, &act1)?,
    ])
}

pub fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    // The 0.6B shape's MLP widths (1.7B's 2,048-wide norm does not defer its scale, which
    // the fold's norm needs: refused below); against one and two stages a warp; bf16 and fp8
    // caches; contexts from one chunk to one cluster's 2,048 tokens.
    let cases = [
        (1usize, 37usize, false),
        (1, 600, false),
        (1, 2048, false),
        (1, 1500, false),
    ];
    let bf = DType::BF16;
    for (stages, l2) in [(1u8, false), (2, false), (1, true)] {
        let k = fold_kernels(dev, stages, l2)?;
        let stages = format!("{stages}{}", if l2 { " l2" } else { "" });
        let heads = (16, 8, 128);
        let (o17, gu17) = (
            Tensor::zeros((2048, 2048), bf, dev)?,
            Tensor::zeros((12288, 2048), bf, dev)?,
        );
        let (o06, gu06) = (
            Tensor::zeros((1024, 2048), bf, dev)?,
            Tensor::zeros((6144, 1024), bf, dev)?,
        );
        let no = |b: bool| f32::from(u8::from(b));
        let served = [
            k.o_fold_serves(1, heads, &o17, &gu17),
            k.o_fold_serves(2, heads, &o06, &gu06),
        ];
        t.check(
            format!("o fold {stages} stages: 1.7B and 2 rows refused"),
            no(served[0] || served[1]),
            0.0,
        );
        t.check(
            format!("o fold {stages} stages: 0.6B 1 row served"),
            no(!k.o_fold_serves(1, heads, &o06, &gu06)),
            0.0,
        );
        for (hidden, inter) in [(1024usize, 3072usize)] {
            for (b, ctx, pad) in cases {
                for fp8 in [None, Some(KvScale::from_amax(896.0, 640.0))] {
                    let e = case(&k, dev, (b, ctx, pad), (hidden, inter), fp8)?;
                    let name = format!(
                        "o fold {stages} stages hidden {hidden} rows {b} ctx {ctx}{}",
                        if fp8.is_some() { " fp8" } else { "" }
                    );
                    t.check(format!("{name}: attention bits"), e[0], 0.0);
                    t.check(format!("{name}: cache bits"), e[1], 0.0);
                    t.check(format!("{name}: partials' sum vs f32"), e[2], 1e-4);
                    t.check(format!("{name}: residual"), e[3], 1e-2);
                    t.check(format!("{name}: SiLU*up"), e[4], 2e-2);
                }
            }
        }
        // A shape the fold does not serve (GQA group 8 as two halves: a block's share of o
        // is 256 KB) is refused before any launch, and the engine's question says no.
        let (i, dt) = (
            inputs(&k, dev, (1, 100, false), (32, 4), None, None)?,
            DType::BF16,
        );
        let o_w = Tensor::zeros((2048, 32 * 128), dt, dev)?;
        let gu = Tensor::zeros((2 * 768, 2048), dt, dev)?;
        let p = Tensor::zeros((1, O_FOLD_PARTS, 2048), DType::F32, dev)?;
        let out = Tensor::zeros((1, 32 * 128), dt, dev)?;
        let kv = KvRef {
            k: &i.kc0,
            v: &i.vc0,
            scale: i.scale,
            fresh: None,
        };
        let counters = k.decode_counters(1, 32)?;
        let refused = k
            .decode_fused_o_into(
                &i.qkv,
                (&i.qw, &i.kw, 1e-6),
                &i.inv,
                (&i.pos, &i.slots),
                kv,
                (&i.tables, Some(&i.width)),
                &i.ctx,
                16,
                &out,
                (i.splits, i.part, i.scratch.as_ref(), &counters),
                (&o_w, &p),
            )
            .is_err();
        let serves = k.o_fold_serves(1, (32, 4, 128), &o_w, &gu);
        let wrong = f32::from(u8::from(!refused || serves));
        t.check(format!("o fold {stages} stages: GQA 8 refused"), wrong, 0.0);
    }
    Ok(())
}
