//! `--stream-check`: the streamed decode step (`KernelOptions::layer_stream`: every layer in
//! one launch) against the five launches a layer, on the same weights and prompts: one row, 64 greedy steps a prompt,
//! eagerly and on a 1-row graph, every path fed the five launches' tokens (so every step is
//! compared). The matmuls sum as the skinny matmuls do but the attention is the CUDA-core
//! loop (the five launches' default for one row is the tensor-core loop), so logits are
//! compared within 2.5e-2 relative (a wrong row, head, partition, merge or norm is off by
//! far more; the table shows the five launches with the unfused attention beside them for
//! scale) and the greedy tokens must agree on at least 60 of 64 steps (near-ties may flip).

use candle_core::{D, DType, Tensor};
use policy_serve::engine::model::Model;
use policy_serve::engine::model::kv_cache::PagedKvCache;
use policy_serve::engine::model::loader::{load_shard, served_context};
use policy_serve::engine::model::shard::Shard;
use policy_serve::engine::runner::graphs::DecodeGraphs;
use policy_serve::engine::{DTypeChoice, KernelOptions, ModelConfig};
use policy_serve::testing::synthetic_prompt;

use super::{Args, BS, Path, Res, Seq, decode, prefill, row_rel, table_for};

/// Steps a prompt decodes.
const STEPS: usize = 64;

pub(super) fn stream_check(
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
        layer_stream: None,
        ..opts
    })?;
    let one = load(KernelOptions {
        layer_stream: opts.layer_stream.or(Some(4)),
        ..opts
    })?;
    let width = (7100 + STEPS + 8).div_ceil(BS);
    let cache = |m: &Model| PagedKvCache::new(cfg, m.local_kv_heads(), width, BS, DType::BF16, dev);
    let unfused = load(KernelOptions {
        layer_stream: None,
        fused_decode: false,
        ..opts
    })?;
    let caches = [cache(&five)?, cache(&one)?, cache(&one)?, cache(&unfused)?];
    let mut g =
        DecodeGraphs::allocate(&one, (1, 1), served_context(cfg), BS, &[])?.ok_or("no kernels")?;
    g.capture(&one, &caches[2], true, None)?;
    println!(
        "| prompt | max rel eager | max rel graph | argmax equal eager | graph | bits equal eager | unfused five: max rel |"
    );
    println!("|---|---|---|---|---|---|---|");
    for n in [5usize, 600, 1990, 3000, 7000] {
        let mk = || {
            vec![Seq {
                tokens: synthetic_prompt(n, 4000 + n),
                table: table_for(0, width),
            }]
        };
        let mut runs = [mk(), mk(), mk(), mk()];
        let models = [&five, &one, &one, &unfused];
        for ((r, c), m) in runs.iter_mut().zip(&caches).zip(models) {
            prefill(m, c, &mut r.iter_mut().collect::<Vec<_>>())?;
        }
        // Every path starts from the five launches' first token.
        let first = *runs[0][0].tokens.last().ok_or("no token")?;
        for r in &mut runs[1..] {
            *r[0].tokens.last_mut().ok_or("no token")? = first;
        }
        let (mut worst, mut worst_g, mut eq, mut eq_g, mut bits) = (0f32, 0f32, 0, 0, 0);
        let mut scale = 0f32;
        for _ in 0..STEPS {
            let [r0, r1, r2, r3] = &mut runs;
            let step = |m: &Model, c: &PagedKvCache, p: &Path<'_>, r: &mut Vec<Seq>| {
                decode(m, c, p, &mut r.iter_mut().collect::<Vec<_>>())
            };
            let l0 = step(&five, &caches[0], &Path::Eager, r0)?;
            let l1 = step(&one, &caches[1], &Path::Eager, r1)?;
            let l2 = step(&one, &caches[2], &Path::Graph(&g), r2)?;
            let l3 = step(&unfused, &caches[3], &Path::Eager, r3)?;
            scale = scale.max(row_rel(&l0, &l3)?);
            worst = worst.max(row_rel(&l0, &l1)?);
            worst_g = worst_g.max(row_rel(&l0, &l2)?);
            let max_diff = |x: &Tensor| -> Res<f32> {
                Ok((x - &l0)?
                    .abs()?
                    .flatten_all()?
                    .max(D::Minus1)?
                    .to_scalar::<f32>()?)
            };
            bits += usize::from(max_diff(&l1)? == 0.0);
            // Every path goes on with the five launches' token.
            let t0 = *r0[0].tokens.last().ok_or("no token")?;
            *r3[0].tokens.last_mut().ok_or("no token")? = t0;
            for (r, e) in [(r1, &mut eq), (r2, &mut eq_g)] {
                let t = r[0].tokens.last_mut().ok_or("no token")?;
                *e += usize::from(*t == t0);
                *t = t0;
            }
        }
        let ok = worst <= 2.5e-2 && worst_g <= 2.5e-2 && eq >= STEPS - 4 && eq_g >= STEPS - 4;
        *fails += u32::from(!ok);
        println!(
            "| {n} | {worst:.2e} | {worst_g:.2e} | {eq}/{STEPS} | {eq_g}/{STEPS} | {bits}/{STEPS} | {scale:.2e} |{}",
            if ok { "" } else { " FAIL" }
        );
    }
    Ok(())
}
