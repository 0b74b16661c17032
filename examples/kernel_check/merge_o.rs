//! The fused decode attention's partials merged inside o (`LaunchOptions::attn_merge_o`):
//! `decode_fused_partials_into` then `merge_o_into` against the unfused tensor-core kernels at
//! the same partitioning (the q/k norm + RoPE + KV write, the paged decode in S partitions of
//! at least `MERGE_O_PART_MIN` tokens and its merge) followed by the plain skinny matmul
//! (`linear_into`). o's output must be the same bits (a partial merged from the wrong slot or
//! row, a partition count other than the attention's, an input rounded elsewhere than the
//! merge's store, or a weight batch loaded for the wrong row fails it), the K/V rows written
//! the same bits, and the merge counters untouched (the launch takes none).

use candle_core::{DType, Device, Tensor};
use policy_serve::engine::cuda::{CudaKernels, LaunchOptions, MERGE_O_PART_MIN};
use policy_serve::engine::kv_format::{KvRef, KvScale};

use super::fused::{Inputs, inputs, max_abs_diff};
use super::{Res, Table, randn};

/// One case: `b` rows (row 1 a padding row when `pad`) up to `max_ctx` tokens, `nh`/`nkv`
/// heads, o of `n_out` rows, caches fp8 with `fp8`: (o's worst difference, the caches',
/// the counters left).
fn case(
    k: &CudaKernels,
    dev: &Device,
    (b, max_ctx, pad): (usize, usize, bool),
    (nh, nkv): (usize, usize),
    n_out: usize,
    fp8: Option<KvScale>,
) -> Res<(f32, f32, u32)> {
    let (hd, bs, dt) = (128usize, 16usize, DType::BF16);
    let s = k
        .merge_o_splits(b, true, (nh, nkv))
        .ok_or("attn_merge_o does not serve the case")?;
    let i: Inputs = inputs(k, dev, (b, max_ctx, pad), (nh, nkv), Some(s), fp8)?;
    let scratch = i.scratch.as_ref().ok_or("no partials scratch")?;
    let w =
        (randn(&[n_out, nh * hd], dt, dev)? * (1.0 / ((nh * hd) as f64).sqrt()))?.to_dtype(dt)?;
    let tables = (&i.tables, Some(&i.width));

    // Unfused, at S partitions of at least MERGE_O_PART_MIN tokens, then the plain matmul.
    let (kc1, vc1) = (i.kc0.copy()?, i.vc0.copy()?);
    let q = Tensor::zeros((b, nh, hd), dt, dev)?;
    let kv1 = KvRef {
        k: &kc1,
        v: &vc1,
        scale: i.scale,
        fresh: None,
    };
    k.qk_norm_rope_kv_write_into(
        &i.qkv,
        (&i.qw, &i.kw),
        &i.inv,
        (&i.pos, &i.slots),
        kv1,
        (nh, nkv, hd),
        1e-6,
        &q,
    )?;
    let attn1 = Tensor::zeros((b, nh * hd), dt, dev)?;
    let ref_scratch = k.decode_scratch(b, nh, s)?;
    k.paged_decode_into(
        &q,
        KvRef {
            k: &kc1,
            v: &vc1,
            scale: i.scale,
            fresh: None,
        },
        tables,
        &i.ctx,
        bs,
        &attn1,
        (s, MERGE_O_PART_MIN, ref_scratch.as_ref()),
    )?;
    let o1 = Tensor::zeros((b, n_out), dt, dev)?;
    k.linear_into(&attn1, &w, &o1)?;

    // The partials, then o merging them: twice (the second launch finds what the first left).
    let (kc2, vc2) = (i.kc0.copy()?, i.vc0.copy()?);
    let counters = k.decode_counters(b, nh)?;
    let mut worst = 0f32;
    for _ in 0..2 {
        let attn2 = Tensor::ones((b, nh * hd), dt, dev)?;
        k.decode_fused_partials_into(
            &i.qkv,
            (&i.qw, &i.kw, 1e-6),
            &i.inv,
            (&i.pos, &i.slots),
            KvRef {
                k: &kc2,
                v: &vc2,
                scale: i.scale,
                fresh: None,
            },
            tables,
            &i.ctx,
            bs,
            &attn2,
            (s, scratch, &counters),
        )?;
        let o2 = Tensor::ones((b, n_out), dt, dev)?;
        k.merge_o_into(scratch, &i.ctx, s, &w, &o2)?;
        worst = worst.max(max_abs_diff(&o1, &o2)?);
    }
    let cache = max_abs_diff(&kc1, &kc2)?.max(max_abs_diff(&vc1, &vc2)?);
    let left = counters.sum_all()?.to_scalar::<u32>()?;
    Ok((worst, cache, left))
}

/// (rows, longest context, row 1 padding), (nh, nkv), o's output rows.
type Case = ((usize, usize, bool), (usize, usize), usize);

pub fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    // The shapes: 0.6B / 1.7B (16 / 8 heads, o 1,024 / 2,048 rows), group 1, and the
    // 30B-A3B's group 8 (32 / 4, run as two group-4 halves a KV head).
    let cases: &[Case] = &[
        ((1, 1, false), (16, 8), 1024),
        ((1, 17, false), (16, 8), 1024),
        ((1, 100, false), (16, 8), 1024),
        ((1, 512, false), (16, 8), 1024),
        ((1, 600, false), (16, 8), 2048),
        ((1, 2048, false), (16, 8), 1024),
        ((2, 300, false), (16, 8), 1024),
        ((2, 700, true), (16, 8), 2048),
        ((2, 2000, false), (16, 8), 1024),
        ((1, 333, false), (8, 8), 1000),
        ((1, 600, false), (32, 4), 2048),
        ((2, 1100, true), (32, 4), 2048),
    ];
    for stages in [1u8, 2] {
        for s in [4usize, 8, 16] {
            let o = LaunchOptions {
                mma_decode: true,
                fused_mma: Some(stages),
                fused_mma_one: None,
                fused_mma_rows: usize::MAX,
                attn_merge_o: Some(s),
                ..LaunchOptions::default()
            };
            let k = CudaKernels::new(dev, DType::BF16, &o)?.ok_or("no kernels")?;
            let fp8 = KvScale { k: 0.04, v: 0.03 };
            let runs = cases
                .iter()
                .map(|c| (c, None))
                .chain(cases.iter().take(3).map(|c| (c, Some(fp8))));
            for (&(rows, heads, n_out), fp8) in runs {
                let (out, cache, left) = case(&k, dev, rows, heads, n_out, fp8)?;
                let name = format!(
                    "merge_o mma{stages} S {s} B {} ctx {} nh {} nkv {} o {n_out}{}",
                    rows.0,
                    rows.1,
                    heads.0,
                    heads.1,
                    if fp8.is_some() { " fp8" } else { "" }
                );
                t.check(format!("{name} (o = unfused + linear, bits)"), out, 0.0);
                t.check(format!("{name} (K/V = unfused)"), cache, 0.0);
                t.check(format!("{name} (counters untouched)"), left as f32, 0.0);
            }
        }
    }
    Ok(())
}
