//! The bench model without an engine: tensor-parallel links, the NCCL self-test and the
//! step-by-step profile.

use super::*;

#[cfg(feature = "nccl")]
pub(super) fn tp_link(
    a: &Args,
    dev: &Device,
) -> Result<policy_serve::engine::CommHandle, Box<dyn std::error::Error>> {
    let addr = a.rendezvous.ok_or("--world-size > 1 needs --rendezvous")?;
    let comm = policy_serve::engine::parallel::nccl::NcclComm::connect(
        0,
        a.world_size,
        addr,
        dev,
        std::time::Duration::from_secs(300),
    )?;
    Ok(policy_serve::engine::CommHandle(std::sync::Arc::new(comm)))
}

#[cfg(not(feature = "nccl"))]
pub(super) fn tp_link(
    _: &Args,
    _: &Device,
) -> Result<policy_serve::engine::CommHandle, Box<dyn std::error::Error>> {
    Err("tensor parallelism across processes needs --features nccl".into())
}

/// The NCCL backend in a group of one: all-reduce and all-gather return their input, and a
/// Qwen3 forward through the NCCL all-reduce path equals the plain forward.
#[cfg(feature = "nccl")]
pub(super) fn nccl_selftest(
    dir: &Path,
    cfg: &serde_json::Value,
    dtype: DType,
    dev: &Device,
) -> Result<(), Box<dyn std::error::Error>> {
    use policy_serve::engine::CommBackend;
    use policy_serve::engine::batch::{LogitRows, SeqInput};
    use policy_serve::engine::model::kv_cache::PagedKvCache;
    let comm = policy_serve::engine::parallel::nccl::NcclComm::connect(
        0,
        1,
        "127.0.0.1:1".parse()?,
        dev,
        std::time::Duration::from_secs(10),
    )?;
    let x = Tensor::randn(0f32, 1.0, (4, 1024), dev)?.to_dtype(dtype)?;
    let r = comm.all_reduce_sum(&x)?;
    let g = comm.all_gather(&x, 1)?;
    let d1 = (r.to_dtype(DType::F32)? - x.to_dtype(DType::F32)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    let d2 = (g.to_dtype(DType::F32)? - x.to_dtype(DType::F32)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    comm.barrier()?;
    let (mcfg, model) = load_bare(dir, cfg, dtype, dev)?;
    let cache = PagedKvCache::new(&mcfg, model.local_kv_heads(), 8, 16, dtype, dev)?;
    let tokens = prompt(100, 3);
    let table: Vec<u32> = (0..8).collect();
    let seqs = [SeqInput {
        q_len: 100,
        context_len: 100,
        block_table: &table,
        logits: LogitRows::All,
        adapter: None,
    }];
    let plain = model
        .forward(&tokens, &seqs, &cache, None)?
        .ok_or("logits")?;
    let via = model
        .forward(&tokens, &seqs, &cache, Some(&comm))?
        .ok_or("logits")?;
    let d3 = (plain - via)?.abs()?.max_all()?.to_scalar::<f32>()?;
    println!(
        "nccl-selftest world 1: all_reduce max diff {d1}, all_gather max diff {d2}, barrier ok, forward via NCCL vs plain max diff {d3}"
    );
    Ok(())
}

#[cfg(not(feature = "nccl"))]
pub(super) fn nccl_selftest(
    _: &Path,
    _: &serde_json::Value,
    _: DType,
    _: &Device,
) -> Result<(), Box<dyn std::error::Error>> {
    Err("--nccl-selftest needs --features nccl".into())
}

/// Bare model decode steps (no scheduler, no sampling beyond a device argmax): what the
/// forward itself costs per step at each batch size, to compare with the engine's ms/step.
pub(super) fn profile_steps(
    dir: &Path,
    cfg: &serde_json::Value,
    dtype: DType,
    dev: &Device,
    a: &Args,
) -> Result<(), Box<dyn std::error::Error>> {
    use policy_serve::engine::batch::{LogitRows, SeqInput};
    use policy_serve::engine::model::kv_cache::PagedKvCache;
    let (mcfg, model) = load_bare(dir, cfg, dtype, dev)?;
    for &b in &a.batches {
        let per_seq = (a.prompt + a.new_tokens).div_ceil(16);
        let cache = PagedKvCache::new(&mcfg, model.local_kv_heads(), b * per_seq, 16, dtype, dev)?;
        let tables: Vec<Vec<u32>> = (0..b)
            .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
            .collect();
        for (i, t) in tables.iter().enumerate() {
            let seqs = [SeqInput {
                q_len: a.prompt,
                context_len: a.prompt,
                block_table: t,
                logits: LogitRows::Last,
                adapter: None,
            }];
            model.forward(&prompt(a.prompt, i), &seqs, &cache, None)?;
        }
        let steps = 50.min(a.new_tokens);
        let mut ctx = a.prompt;
        let mut tokens: Vec<u32> = vec![1; b];
        let run = |ctx: usize, tokens: &[u32]| -> Result<Vec<u32>, Box<dyn std::error::Error>> {
            let seqs: Vec<SeqInput<'_>> = tables
                .iter()
                .map(|t| SeqInput {
                    q_len: 1,
                    context_len: ctx + 1,
                    block_table: t,
                    logits: LogitRows::Last,
                    adapter: None,
                })
                .collect();
            let l = model
                .forward(tokens, &seqs, &cache, None)?
                .ok_or("logits")?;
            Ok(l.argmax(candle_core::D::Minus1)?.to_vec1::<u32>()?)
        };
        tokens = run(ctx, &tokens)?; // warm-up
        ctx += 1;
        sync(dev);
        let t = Instant::now();
        for _ in 0..steps {
            tokens = run(ctx, &tokens)?;
            ctx += 1;
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
        println!(
            "profile bare decode batch {b}: {ms:.2} ms/step ({:.0} tok/s)",
            b as f64 * 1e3 / ms
        );
    }
    Ok(())
}

/// The dtype choice that resolves to `d`.
pub(super) fn choice(d: DType) -> DTypeChoice {
    match d {
        DType::BF16 => DTypeChoice::BF16,
        DType::F16 => DTypeChoice::F16,
        _ => DTypeChoice::F32,
    }
}

/// The bench model as a bare `Model` (no engine), for step timing and the NCCL self-test.
pub(super) fn load_bare(
    dir: &Path,
    cfg: &serde_json::Value,
    dtype: DType,
    dev: &Device,
) -> Result<
    (
        policy_serve::engine::ModelConfig,
        policy_serve::engine::model::Model,
    ),
    Box<dyn std::error::Error>,
> {
    let mcfg = policy_serve::engine::ModelConfig::from_json(&cfg.to_string())?;
    let model = policy_serve::engine::model::loader::load_shard(
        "bench",
        &mcfg,
        &policy_serve::engine::model::files::safetensors_in(dir)?,
        choice(dtype),
        dev,
        policy_serve::engine::model::shard::Shard::FULL,
        &policy_serve::engine::KernelOptions::default(),
        || {},
    )?;
    Ok((mcfg, model))
}
