//! `--qkv-check`: the 1-row step with the layer's add + norm + qkv matmul inside the fused
//! attention (`KernelOptions::attn_qkv`) against the same model without it: the same prompts,
//! 64 greedy steps eagerly and on 1-row graphs; the logits must be bit for bit equal (the
//! kernel sums as the skinny matmul does). Prompts of 5-1,900 tokens take it (contexts of up
//! to 2,048 tokens, which one cluster holds); 2,100 and 4,000 check that longer contexts
//! keep the qkv launch.

use candle_core::DType;
use policy_serve::engine::model::Model;
use policy_serve::engine::model::kv_cache::PagedKvCache;
use policy_serve::engine::model::loader::{load_shard, served_context};
use policy_serve::engine::model::shard::Shard;
use policy_serve::engine::runner::graphs::DecodeGraphs;
use policy_serve::engine::{DTypeChoice, KernelOptions, ModelConfig};
use policy_serve::testing::synthetic_prompt;

use super::{Args, BS, Path, Res, Seq, decode, prefill, table_for};

const STEPS: usize = 64;

/// Loads the model twice (as asked, and with `attn_qkv`), then compares them per prompt.
pub fn qkv_check(a: &Args, dev: &candle_core::Device, fails: &mut u32) -> Res<()> {
    let cfg = ModelConfig::from_file(&a.model_dir.join("config.json"))?;
    let weights = [a.model_dir.join("model.safetensors")];
    let base = a.kernels.options();
    let mut with = base.clone();
    with.attn_qkv = with
        .attn_qkv
        .or(Some(policy_serve::engine::AttnQkv::Registers));
    let load = |o| {
        load_shard(
            "check",
            &cfg,
            &weights,
            DTypeChoice::BF16,
            dev,
            Shard::FULL,
            o,
            || {},
        )
    };
    let base = KernelOptions {
        attn_qkv: None,
        ..base
    };
    let (m0, m1) = (load(&base)?, load(&with)?);
    let kf = m1.kernel_forward().ok_or("no kernels")?;
    let (nh, nkv, hd) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim(),
    );
    let shape = ((nh + 2 * nkv) * hd, cfg.hidden_size);
    let served = kf.kernels.attn_qkv_serves((nh, nkv, hd), shape, 64);
    println!("qkv check: attn_qkv served at 64 partitions: {served:?} (Some(deferred norm))");
    if served.is_none() {
        *fails += 1;
        println!("qkv check: not served FAIL");
        return Ok(());
    }
    let ctx = served_context(&cfg);
    let graphs = |m: &Model, c: &PagedKvCache| -> Res<DecodeGraphs> {
        let mut g = DecodeGraphs::allocate(m, (1, 1), ctx, BS, &[])?.ok_or("no kernels")?;
        g.capture(m, c, true, None)?;
        Ok(g)
    };
    println!("| prompt | path | equal tokens | max abs logits diff |");
    println!("|---|---|---|---|");
    for (i, &len) in [5usize, 600, 1_900, 2_100, 4_000].iter().enumerate() {
        let width = (len + STEPS + 2).div_ceil(BS);
        let blocks = width + 4;
        for graph in [false, true] {
            let mut runs = Vec::new();
            for m in [&m0, &m1] {
                let cache =
                    PagedKvCache::new(&cfg, m.local_kv_heads(), blocks, BS, DType::BF16, dev)?;
                let g = if graph {
                    Some(graphs(m, &cache)?)
                } else {
                    None
                };
                let path = g.as_ref().map_or(Path::Eager, Path::Graph);
                let mut s = Seq {
                    tokens: synthetic_prompt(len, 7_000 + i),
                    table: table_for(0, width),
                };
                prefill(m, &cache, &mut [&mut s])?;
                let mut logits = Vec::new();
                for _ in 0..STEPS {
                    logits.push(decode(m, &cache, &path, &mut [&mut s])?);
                }
                runs.push((s.tokens, logits));
            }
            let equal = runs[0].0 == runs[1].0;
            let mut worst = 0f32;
            for (x, y) in runs[0].1.iter().zip(&runs[1].1) {
                let d: f32 = (x - y)?.abs()?.flatten_all()?.max(0)?.to_scalar()?;
                worst = worst.max(d);
            }
            let ok = equal && worst == 0.0;
            *fails += u32::from(!ok);
            let how = if graph { "graph" } else { "eager" };
            let fail = if ok { "" } else { " FAIL" };
            println!("| {len} | {how} | {equal} | {worst:.3e} |{fail}");
        }
    }
    Ok(())
}
