//! Where a decode step's GPU time goes: each op of a layer timed alone (20 launches captured
//! in a graph, replayed), the skinny matmuls against cuBLAS, and whole steps replayed from the
//! engine's graphs with and without the host round trip of the sampled tokens.

use std::time::Instant;

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::{DType, Device, Tensor};
use policy_serve::engine::ModelConfig;
use policy_serve::engine::batch::{LogitRows, SeqInput};
use policy_serve::engine::cuda::{CudaKernels, LaunchOptions};
use policy_serve::engine::kv_format::KvRef;
use policy_serve::engine::model::Model;
use policy_serve::engine::model::kv_cache::PagedKvCache;
use policy_serve::engine::model::loader::served_context;
use policy_serve::engine::runner::graphs::DecodeGraphs;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Microseconds per launch of `f`, from 20 launches captured in a graph and replayed 10 times.
pub fn time_us(dev: &Device, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
    let Device::Cuda(cd) = dev else {
        return Err("not CUDA".into());
    };
    let stream = cd.cuda_stream();
    f()?;
    stream.synchronize()?;
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let mut r = Ok(());
    for _ in 0..20 {
        r = r.and_then(|_| f());
    }
    let g = stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
    r?;
    let g = g.ok_or("empty graph")?;
    g.launch()?;
    stream.synchronize()?;
    let t = Instant::now();
    for _ in 0..10 {
        g.launch()?;
    }
    stream.synchronize()?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / 200.0)
}

fn randn(shape: &[usize], dev: &Device) -> Res<Tensor> {
    Ok(Tensor::randn(0f32, 0.5, shape, dev)?.to_dtype(DType::BF16)?)
}

/// `ours` times the kernels as `opts` switches them (`--gemv-mma`: tensor-core matmuls at 3-8
/// rows); `skips`: masks of ops whole steps are also timed without (`--profile-skip`).
pub fn run(
    m: &Model,
    cfg: &ModelConfig,
    dev: &Device,
    (batches, skips): (&[usize], &[u8]),
    ours: &LaunchOptions,
) -> Res<()> {
    let no_gemv = LaunchOptions {
        gemv: false,
        ..LaunchOptions::default()
    };
    let blas = CudaKernels::new(dev, DType::BF16, &no_gemv)?.ok_or("kernels")?;
    let k = CudaKernels::new(dev, DType::BF16, ours)?.ok_or("kernels")?;
    let (h, hd) = (cfg.hidden_size, cfg.head_dim());
    let (nh, nkv, inter, vocab) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
        cfg.vocab_size,
    );
    let layers = cfg.num_hidden_layers as f64;
    let qkv_n = (nh + 2 * nkv) * hd;
    let w_qkv = randn(&[qkv_n, h], dev)?;
    let w_o = randn(&[h, nh * hd], dev)?;
    let w_gu = randn(&[2 * inter, h], dev)?;
    let w_down = randn(&[h, inter], dev)?;
    let w_lm = randn(&[vocab, h], dev)?;
    let norm_w = randn(&[h], dev)?;
    let qn = randn(&[hd], dev)?;
    let inv_freq = Tensor::ones(hd / 2, DType::F32, dev)?;
    let ctx = 600usize;
    for &b in batches {
        let x = randn(&[b, h], dev)?;
        let res = randn(&[b, h], dev)?;
        let qkv = randn(&[b, qkv_n], dev)?;
        let attn = randn(&[b, nh * hd], dev)?;
        let act = randn(&[b, inter], dev)?;
        let gu = randn(&[b, 2 * inter], dev)?;
        let out_h = randn(&[b, h], dev)?;
        let out_h2 = randn(&[b, h], dev)?;
        let out_qkv = randn(&[b, qkv_n], dev)?;
        let out_act = randn(&[b, inter], dev)?;
        let q = randn(&[b, nh, hd], dev)?;
        let logits = randn(&[b, vocab], dev)?;
        let logits32 = Tensor::zeros((b, vocab), DType::F32, dev)?;
        let per = ctx.div_ceil(16) + 1;
        let kc = randn(&[nkv, b * per * 16, hd], dev)?;
        let vc = randn(&[nkv, b * per * 16, hd], dev)?;
        let tables: Vec<u32> = (0..(b * per) as u32).collect();
        let tables = Tensor::from_vec(tables, (b, per), dev)?;
        let ctx_t = Tensor::new(vec![ctx as u32; b].as_slice(), dev)?;
        let pos = Tensor::new(vec![ctx as u32 - 1; b].as_slice(), dev)?;
        let slots: Vec<u32> = (0..b).map(|i| (i * per * 16 + ctx - 1) as u32).collect();
        let slots = Tensor::new(slots.as_slice(), dev)?;
        let part = CudaKernels::decode_partition(b);
        let splits = k.cluster_splits(b, CudaKernels::decode_splits(per, 16, part));
        let scratch = k.decode_scratch(b, nh, splits)?;
        let counters = k.decode_counters(b, nh)?;
        let fused_stage = |stop: i32| {
            time_us(dev, || {
                Ok(k.decode_fused_stage_into(
                    &qkv,
                    (&qn, &qn, 1e-6),
                    &inv_freq,
                    (&pos, &slots),
                    KvRef::plain(&kc, &vc),
                    (&tables, None),
                    &ctx_t,
                    16,
                    &attn,
                    (splits, part, scratch.as_ref(), &counters),
                    true,
                    stop,
                )?)
            })
        };
        let rows: Vec<(&str, f64, usize)> = vec![
            (
                "add_rmsnorm (unfused)",
                time_us(dev, || {
                    Ok(k.add_rmsnorm_into(Some(&x), &res, &norm_w, 1e-6, &out_h)?)
                })?,
                0,
            ),
            (
                "add+norm+qkv (ours, fused)",
                time_us(dev, || {
                    let r = (&res, Some(&x), &out_h2);
                    Ok(k.norm_linear_into(
                        r,
                        (&norm_w, 1e-6),
                        &out_h,
                        &w_qkv,
                        &out_qkv,
                        None,
                        None,
                    )?)
                })?,
                1,
            ),
            (
                "qkv (ours)",
                time_us(dev, || Ok(k.linear_into(&x, &w_qkv, &out_qkv)?))?,
                0,
            ),
            (
                "qkv (cuBLAS)",
                time_us(dev, || Ok(blas.linear_into(&x, &w_qkv, &out_qkv)?))?,
                0,
            ),
            (
                "qk_norm_rope_kv_write",
                time_us(dev, || {
                    Ok(k.qk_norm_rope_kv_write_into(
                        &qkv,
                        (&qn, &qn),
                        &inv_freq,
                        (&pos, &slots),
                        KvRef::plain(&kc, &vc),
                        (nh, nkv, hd),
                        1e-6,
                        &q,
                    )?)
                })?,
                0,
            ),
            (
                "paged_decode ctx 600",
                time_us(dev, || {
                    Ok(k.paged_decode_into(
                        &q,
                        KvRef::plain(&kc, &vc),
                        (&tables, None),
                        &ctx_t,
                        16,
                        &attn,
                        (splits, part, scratch.as_ref()),
                    )?)
                })?,
                0,
            ),
            (
                "fused decode attention (norm+RoPE+KV write+attention+merge)",
                fused_stage(0)?,
                1,
            ),
            (
                "fused decode attention, without clusters",
                fused_stage(-1)?,
                0,
            ),
            (
                "fused attention, phases 1 (K/V prefetch, wait)",
                fused_stage(1)?,
                0,
            ),
            (
                "fused attention, phases 1-2 (+ q/k norm, RoPE)",
                fused_stage(2)?,
                0,
            ),
            (
                "fused attention, phases 1-3 (+ attention loop)",
                fused_stage(3)?,
                0,
            ),
            (
                "fused attention, phases 1-4 (+ partial written)",
                fused_stage(4)?,
                0,
            ),
            (
                "o_proj (ours)",
                time_us(dev, || Ok(k.linear_into(&attn, &w_o, &out_h)?))?,
                1,
            ),
            (
                "o_proj (cuBLAS)",
                time_us(dev, || Ok(blas.linear_into(&attn, &w_o, &out_h)?))?,
                0,
            ),
            (
                "add+norm+gate_up+silu (ours, fused)",
                time_us(dev, || {
                    let r = (&res, Some(&x), &out_h2);
                    let silu = Some((&gu, &out_act));
                    Ok(k.norm_linear_into(r, (&norm_w, 1e-6), &out_h, &w_gu, &gu, silu, None)?)
                })?,
                1,
            ),
            (
                "gate_up+silu (ours)",
                time_us(dev, || Ok(k.gate_up_silu_into(&x, &w_gu, &gu, &out_act)?))?,
                0,
            ),
            (
                "gate_up+silu (cuBLAS+silu)",
                time_us(
                    dev,
                    || Ok(blas.gate_up_silu_into(&x, &w_gu, &gu, &out_act)?),
                )?,
                0,
            ),
            (
                "down (ours)",
                time_us(dev, || Ok(k.linear_into(&act, &w_down, &out_h)?))?,
                1,
            ),
            (
                "down (cuBLAS)",
                time_us(dev, || Ok(blas.linear_into(&act, &w_down, &out_h)?))?,
                0,
            ),
        ];
        let lm = time_us(dev, || Ok(k.linear_into(&x, &w_lm, &logits)?))?;
        let lm_blas = time_us(dev, || Ok(blas.linear_into(&x, &w_lm, &logits)?))?;
        let f32c = time_us(dev, || Ok(k.to_f32_into(&logits, &logits32)?))?;
        // argmax allocates its output: timed eagerly, 100 launches then one sync.
        k.argmax(&logits32)?;
        dev.synchronize()?;
        let t = Instant::now();
        for _ in 0..100 {
            k.argmax(&logits32)?;
        }
        dev.synchronize()?;
        let am = t.elapsed().as_secs_f64() * 1e4;
        println!("\n## batch {b}: one op at a time (us per launch; x per layer)");
        println!("| op | us | per layer |");
        println!("|---|---|---|");
        let mut layer_us = 0.0;
        for (name, us, n) in &rows {
            println!("| {name} | {us:.1} | {n} |");
            layer_us += us * *n as f64;
        }
        println!("| lm_head (ours / cuBLAS) | {lm:.1} / {lm_blas:.1} | - |");
        println!("| to_f32 logits | {f32c:.1} | - |");
        println!("| argmax | {am:.1} | - |");
        println!(
            "sum of ops: {layer_us:.1} us per layer, {:.0} us per step ({layers} layers + head)",
            layer_us * layers + lm + f32c
        );
        super::lora_profile::rows(cfg, dev, b)?;
    }
    // Whole steps on the engine's graphs.
    let bs = 16;
    let per = (600 + 2 + 64usize).div_ceil(bs);
    let bmax = batches.iter().copied().max().unwrap_or(1);
    let cache = PagedKvCache::new(cfg, m.local_kv_heads(), bmax * per, bs, DType::BF16, dev)?;
    let mut g = DecodeGraphs::allocate(m, (bmax, bmax), served_context(cfg), bs, &[])?
        .ok_or("no kernels")?;
    for graph_pdl in ["0", "1"] {
        g.capture(m, &cache, graph_pdl == "1", None)?;
        for &b in batches {
            replay_steps(m, &k, dev, &g, b, per, graph_pdl)?;
        }
    }
    // Each op's share of the chain: the step without it (its outputs are then garbage).
    for &mask in skips {
        g.set_profile_skip(mask);
        g.capture(m, &cache, true, None)?;
        for &b in batches {
            replay_steps(m, &k, dev, &g, b, per, &format!("1, without ops {mask}"))?;
        }
    }
    Ok(())
}

/// `b` block tables of `per` blocks each, one after another in the cache.
pub fn block_tables(b: usize, per: usize) -> Vec<Vec<u32>> {
    (0..b)
        .map(|i| ((i * per) as u32..((i + 1) * per) as u32).collect())
        .collect()
}

/// One decode step replayed on `g`: a token (7) a sequence of `tables`, each at `ctx` tokens of
/// context; the step's logits.
pub fn replay_decode(m: &Model, g: &DecodeGraphs, tables: &[Vec<u32>], ctx: usize) -> Res<Tensor> {
    let tokens = vec![7u32; tables.len()];
    let seqs: Vec<SeqInput<'_>> = tables
        .iter()
        .map(|t| SeqInput {
            q_len: 1,
            context_len: ctx,
            block_table: t,
            logits: LogitRows::Last,
            adapter: None,
        })
        .collect();
    Ok(g.replay(m, &tokens, &seqs)?.ok_or("no replay")?)
}

/// Times whole steps of batch `b` replayed on `g` (captured with PDL in the graph when
/// `graph_pdl` is "1"), back to back and with the sampled tokens read back each step.
fn replay_steps(
    m: &Model,
    k: &CudaKernels,
    dev: &Device,
    g: &DecodeGraphs,
    b: usize,
    per: usize,
    graph_pdl: &str,
) -> Res<()> {
    let tables = block_tables(b, per);
    let step = |ctx: usize| replay_decode(m, g, &tables, ctx);
    step(600)?;
    dev.synchronize()?;
    let t = Instant::now();
    for i in 0..50 {
        step(600 + i)?;
    }
    dev.synchronize()?;
    let replay_us = t.elapsed().as_secs_f64() * 1e6 / 50.0;
    let t = Instant::now();
    for i in 0..50 {
        let l = step(600 + i)?;
        let _: Vec<u32> = k.argmax(&l)?.to_vec1()?;
    }
    let sync_us = t.elapsed().as_secs_f64() * 1e6 / 50.0;
    println!(
        "batch {b} graph_pdl {graph_pdl}: graph replay {replay_us:.0} us/step back to back ({:.0} tok/s); with argmax + ids to the host each step {sync_us:.0} us ({:.0} tok/s)",
        b as f64 * 1e6 / replay_us,
        b as f64 * 1e6 / sync_us
    );
    Ok(())
}
