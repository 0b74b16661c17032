//! `--layer-check`: the decode layer kernel (`KernelOptions::layer_kernel`) against the five
//! launches a layer, on the same weights and prompts: batches of 1 and 2 rows, 64 greedy
//! steps each, eagerly and on graphs. Up to a context of 2,048 tokens the logits must be the
//! same bits (the layer kernel sums in the same order; a changed partition, merge order or
//! norm rounding fails it); past it (partitions of 128 tokens, one-level merge) within 1e-2.

use candle_core::DType;
use policy_serve::engine::model::Model;
use policy_serve::engine::model::kv_cache::PagedKvCache;
use policy_serve::engine::model::loader::{load_shard, served_context};
use policy_serve::engine::model::shard::Shard;
use policy_serve::engine::runner::graphs::DecodeGraphs;
use policy_serve::engine::{DTypeChoice, KernelOptions, ModelConfig};
use policy_serve::testing::synthetic_prompt;

use super::{Args, BS, Path, Res, Seq, decode, prefill, row_rel, table_for};

/// Steps a case decodes.
const STEPS: usize = 64;
/// The longest context whose partitions the layer kernel shares with the fused attention.
const SAME_BITS_CTX: usize = 2048;

pub(super) fn layer_check(
    a: &Args,
    cfg: &ModelConfig,
    dev: &candle_core::Device,
    fails: &mut u32,
) -> Res<()> {
    let opts = a.kernels.options();
    let load = |o: KernelOptions| -> Res<Model> {
        let weights = [a.model_dir.join("model.safetensors")];
        Ok(load_shard(
            "check",
            cfg,
            &weights,
            DTypeChoice::BF16,
            dev,
            Shard::FULL,
            &o,
            || {},
        )?)
    };
    let five = load(KernelOptions {
        layer_kernel: None,
        ..opts
    })?;
    let one = load(KernelOptions {
        layer_kernel: opts.layer_kernel.or(Some(32)),
        ..opts
    })?;
    let width = (3100 + STEPS + 8).div_ceil(BS);
    let cache =
        |m: &Model| PagedKvCache::new(cfg, m.local_kv_heads(), 2 * width, BS, DType::BF16, dev);
    let caches = [cache(&five)?, cache(&one)?, cache(&one)?];
    let mut g =
        DecodeGraphs::allocate(&one, (2, 2), served_context(cfg), BS, &[])?.ok_or("no kernels")?;
    g.capture(&one, &caches[2], true)?;
    println!(
        "| rows | prompts | eager: steps same bits | graph: steps same bits | max rel (past 2,048) | tokens equal |"
    );
    println!("|---|---|---|---|---|---|");
    let cases: [&[usize]; 7] = [
        &[5],
        &[600],
        &[1990],
        &[3000],
        &[100, 900],
        &[1500, 40],
        &[2030, 300],
    ];
    for lens in cases {
        let mk = || -> Vec<Seq> {
            lens.iter()
                .enumerate()
                .map(|(i, &n)| Seq {
                    tokens: synthetic_prompt(n, 4000 + n + i),
                    table: table_for(i, width),
                })
                .collect()
        };
        let mut runs = [mk(), mk(), mk()];
        for (i, (r, c)) in runs.iter_mut().zip(&caches).enumerate() {
            let m = if i == 0 { &five } else { &one };
            prefill(m, c, &mut r.iter_mut().collect::<Vec<_>>())?;
        }
        let (mut same, mut same_g, mut short, mut worst) = (0, 0, 0, 0f32);
        for _ in 0..STEPS {
            let long = runs[0].iter().any(|s| s.tokens.len() > SAME_BITS_CTX);
            let aligned = runs[1..]
                .iter()
                .all(|r| r.iter().zip(&runs[0]).all(|(x, y)| x.tokens == y.tokens));
            let [r0, r1, r2] = &mut runs;
            let l0 = decode(
                &five,
                &caches[0],
                &Path::Eager,
                &mut r0.iter_mut().collect::<Vec<_>>(),
            )?;
            let l1 = decode(
                &one,
                &caches[1],
                &Path::Eager,
                &mut r1.iter_mut().collect::<Vec<_>>(),
            )?;
            let l2 = decode(
                &one,
                &caches[2],
                &Path::Graph(&g),
                &mut r2.iter_mut().collect::<Vec<_>>(),
            )?;
            if !aligned {
                continue;
            }
            let bits = |x: &candle_core::Tensor| -> Res<bool> {
                Ok((x - &l0)?
                    .abs()?
                    .flatten_all()?
                    .max(0)?
                    .to_scalar::<f32>()?
                    == 0.0)
            };
            if long {
                worst = worst.max(row_rel(&l0, &l1)?).max(row_rel(&l0, &l2)?);
            } else {
                short += 1;
                same += usize::from(bits(&l1)?);
                same_g += usize::from(bits(&l2)?);
            }
        }
        let n = lens.len() * STEPS;
        let eq = |r: &[Seq]| -> usize {
            r.iter()
                .zip(&runs[0])
                .map(|(x, y)| {
                    let (x, y) = (
                        &x.tokens[x.tokens.len() - STEPS..],
                        &y.tokens[y.tokens.len() - STEPS..],
                    );
                    x.iter().zip(y).filter(|(p, q)| p == q).count()
                })
                .sum()
        };
        let (e1, e2) = (eq(&runs[1]), eq(&runs[2]));
        let long_case = lens.iter().any(|&l| l + STEPS > SAME_BITS_CTX);
        let ok = same == short
            && same_g == short
            && worst <= 1e-2
            && (long_case || (e1 == n && e2 == n));
        *fails += u32::from(!ok);
        println!(
            "| {} | {lens:?} | {same}/{short} | {same_g}/{short} | {worst:.2e} | {e1}/{n} eager, {e2}/{n} graph |{}",
            lens.len(),
            if ok { "" } else { " FAIL" }
        );
    }
    Ok(())
}
