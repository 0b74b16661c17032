//! On the GPU: decode steps replayed as CUDA graphs against the same steps run eagerly.
//!
//! 1. Every bucket: a ragged batch (exact for buckets 1-8, three rows of padding above), 128
//!    greedy steps on each path from the same prefill; tokens must be equal and the logits
//!    within 1e-3 relative (max |graph - eager| / max |eager| per row).
//!    Then verify steps of speculative decoding (K = 4, 1-8 sequences, one graph row per
//!    position): logits of every row against the same tokens decoded one eager step at a
//!    time.
//! 2. A batch that shrinks and grows across buckets (sequences finish and arrive on a fixed
//!    schedule): every sequence's tokens equal on both paths.
//! 3. Two engines (graphs on, off) through the public API, 24 staggered requests of different
//!    lengths: tokens equal per request; and 32 requests in one `submit_batch` (both engines
//!    run the same steps: an MoE token depends on its batch, so only this form isolates the
//!    graphs there).
//! 4. Stress: an engine with graphs through 10,000+ steps of random arrivals; every request
//!    completes, a probe request gives the same tokens before and after, and neither the
//!    allocation pool's used bytes nor memory outside the pool grows.
//!
//! ```sh
//! cargo build --release --features cuda --example graph_check
//! .gpu/bench --write-model /tmp/m && .gpu/graph_check --model-dir /tmp/m
//! .gpu/graph_check --model-dir /tmp/m --profile 1,2,8   # where a step's GPU time goes
//! # how a 1-row step's launches overlap, block by block (a profiling build):
//! cargo build --release --features nccl,timeline --example graph_check
//! .gpu/graph_check --model-dir /tmp/m --timeline /tmp/tl.csv
//! ```

mod lora_profile;
mod profile;
mod rows;
mod stress;
#[cfg(feature = "timeline")]
mod timeline;
mod verify;

use stress::{engine_check, stress_check};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use candle_core::{D, DType, Tensor};
use clap::Parser;
use policy_serve::engine::batch::{LogitRows, SeqInput};
use policy_serve::engine::model::Model;
use policy_serve::engine::model::kv_cache::PagedKvCache;
use policy_serve::engine::model::loader::{load_shard, served_context};
use policy_serve::engine::model::shard::Shard;
use policy_serve::engine::runner::graphs::DecodeGraphs;
use policy_serve::engine::{
    DTypeChoice, DeviceChoice, KvBudget, ModelConfig, graph_buckets, select_device,
};
use policy_serve::testing::synthetic_prompt;
use policy_serve::{Engine, EngineOptions, GenerationRequest, ModelRegistry, ModelSpec};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Parser)]
struct Args {
    /// A model directory (written by `bench --write-model`).
    #[arg(long)]
    model_dir: PathBuf,
    /// Steps of the stress run.
    #[arg(long, default_value_t = 10_000)]
    stress_steps: u64,
    /// Only time each op of a decode step and the whole step (graph replay) at these batch
    /// sizes, and exit.
    #[arg(long, value_delimiter = ',')]
    profile: Vec<usize>,
    /// With `--profile`: also time whole steps (PDL in the graph) captured without the ops of
    /// each mask (`kernel_forward::skip` bits: 1 qkv, 2 attention, 4 o, 8 gate|up, 16 down,
    /// 32 lm_head and f32 logits, 64 MoE norm + router, 128 MoE experts), each op's share of
    /// the chain.
    #[arg(long, value_delimiter = ',')]
    profile_skip: Vec<u8>,
    /// Only record two decode steps of the 1-row graph block by block into this CSV file and
    /// print how its launches overlap (a build with the `timeline` feature), and exit.
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// Only the stress run (check 4).
    #[arg(long)]
    stress_only: bool,
    /// Only the verify steps of speculative decoding (the second half of check 1).
    #[arg(long)]
    verify_only: bool,
    /// Only whether each cuBLAS matmul of the model's shapes gives a row the same bits at an
    /// eager step's row count as inside its graph bucket (`rows.rs`).
    #[arg(long)]
    rows_check: bool,
    /// The kernel switches (`--gemv-mma`, `--l2-prefetch`, ...).
    #[command(flatten)]
    kernels: policy_serve::engine::KernelFlags,
}

const BS: usize = 16;

/// One sequence of a model-level run: its tokens so far, block table, and whether it runs.
struct Seq {
    tokens: Vec<u32>,
    table: Vec<u32>,
}

/// Which way decode steps run.
enum Path<'a> {
    Eager,
    Graph(&'a DecodeGraphs),
}

/// Prefills `seqs` (all new tokens) eagerly and appends each one's first token.
fn prefill(m: &Model, cache: &PagedKvCache, seqs: &mut [&mut Seq]) -> Res<()> {
    let tokens: Vec<u32> = seqs.iter().flat_map(|s| s.tokens.clone()).collect();
    let inputs: Vec<SeqInput<'_>> = seqs
        .iter()
        .map(|s| SeqInput {
            q_len: s.tokens.len(),
            context_len: s.tokens.len(),
            block_table: &s.table,
            logits: LogitRows::Last,
            adapter: None,
        })
        .collect();
    let l = m.forward(&tokens, &inputs, cache, None)?.ok_or("logits")?;
    let next: Vec<u32> = l.argmax(D::Minus1)?.to_vec1()?;
    drop(inputs);
    for (s, t) in seqs.iter_mut().zip(next) {
        s.tokens.push(t);
    }
    Ok(())
}

/// One decode step of `seqs` on `path`: appends each one's greedy token; returns the logits.
fn decode(m: &Model, cache: &PagedKvCache, path: &Path<'_>, seqs: &mut [&mut Seq]) -> Res<Tensor> {
    let tokens: Vec<u32> = seqs.iter().map(|s| *s.tokens.last().unwrap()).collect();
    let inputs: Vec<SeqInput<'_>> = seqs
        .iter()
        .map(|s| SeqInput {
            q_len: 1,
            context_len: s.tokens.len(),
            block_table: &s.table,
            logits: LogitRows::Last,
            adapter: None,
        })
        .collect();
    let l = match path {
        Path::Eager => m.forward(&tokens, &inputs, cache, None)?.ok_or("logits")?,
        Path::Graph(g) => g
            .replay(m, &tokens, &inputs)?
            .ok_or("the step did not replay on a graph")?,
    };
    // The graph's logits live in a static buffer: copy before the next step.
    let l = l.copy()?;
    let next: Vec<u32> = l.argmax(D::Minus1)?.to_vec1()?;
    drop(inputs);
    for (s, t) in seqs.iter_mut().zip(next) {
        s.tokens.push(t);
    }
    Ok(l)
}

/// Max over rows of max |a - b| / max |a| (rows of f32 logits).
fn row_rel(a: &Tensor, b: &Tensor) -> Res<f32> {
    let d: Vec<f32> = (a - b)?.abs()?.max(D::Minus1)?.to_vec1()?;
    let s: Vec<f32> = a.abs()?.max(D::Minus1)?.to_vec1()?;
    Ok(d.iter()
        .zip(&s)
        .map(|(d, s)| d / s.max(1e-6))
        .fold(0f32, f32::max))
}

fn table_for(i: usize, width: usize) -> Vec<u32> {
    (0..width).map(|j| (i * width + j) as u32).collect()
}

/// Check 1: every bucket, 128 steps, graph vs eager.
fn buckets_check(
    m: &Model,
    caches: &[PagedKvCache; 2],
    g: &DecodeGraphs,
    fails: &mut u32,
) -> Res<()> {
    println!("| bucket | rows | equal tokens (of rows x 128) | max logits rel err |");
    println!("|---|---|---|---|");
    for &b in g.buckets() {
        let n = if b <= 8 { b } else { b - 3 };
        let width = (200 + 10 + 130usize).div_ceil(BS);
        let mk = || -> Vec<Seq> {
            (0..n)
                .map(|i| Seq {
                    tokens: synthetic_prompt(5 + (i * 37) % 200, 900 + i),
                    table: table_for(i, width),
                })
                .collect()
        };
        let (mut eager, mut graph) = (mk(), mk());
        prefill(m, &caches[0], &mut eager.iter_mut().collect::<Vec<_>>())?;
        prefill(m, &caches[1], &mut graph.iter_mut().collect::<Vec<_>>())?;
        let mut worst = 0f32;
        for _ in 0..128 {
            let le = decode(
                m,
                &caches[0],
                &Path::Eager,
                &mut eager.iter_mut().collect::<Vec<_>>(),
            )?;
            let lg = decode(
                m,
                &caches[1],
                &Path::Graph(g),
                &mut graph.iter_mut().collect::<Vec<_>>(),
            )?;
            if eager.iter().zip(&graph).all(|(a, b)| a.tokens == b.tokens) {
                worst = worst.max(row_rel(&le, &lg)?);
            }
        }
        let equal: usize = eager
            .iter()
            .zip(&graph)
            .map(|(a, b)| {
                let (x, y) = (
                    &a.tokens[a.tokens.len() - 128..],
                    &b.tokens[b.tokens.len() - 128..],
                );
                x.iter().zip(y).filter(|(p, q)| p == q).count()
            })
            .sum();
        let ok = equal == n * 128 && worst <= 1e-3;
        *fails += u32::from(!ok);
        println!(
            "| {b} | {n} | {equal}/{} | {worst:.2e} |{}",
            n * 128,
            if ok { "" } else { " FAIL" }
        );
    }
    Ok(())
}

/// Check 2: 48 sequences arriving every 3 steps, each running 20-109 steps.
fn shrink_grow_check(
    m: &Model,
    caches: &[PagedKvCache; 2],
    g: &DecodeGraphs,
    fails: &mut u32,
) -> Res<()> {
    let count = 48;
    let len = |i: usize| 20 + (i * 29) % 90;
    let width = (120 + 120usize).div_ceil(BS);
    let mut results = Vec::new();
    let mut sizes = std::collections::BTreeSet::new();
    for (ci, path) in [Path::Eager, Path::Graph(g)].iter().enumerate() {
        let mut seqs: Vec<Seq> = (0..count)
            .map(|i| Seq {
                tokens: synthetic_prompt(10 + (i * 53) % 110, 2000 + i),
                table: table_for(i, width),
            })
            .collect();
        let prompt_len: Vec<usize> = seqs.iter().map(|s| s.tokens.len()).collect();
        for step in 0.. {
            let arriving: Vec<usize> = (0..count).filter(|&i| i * 3 == step).collect();
            if !arriving.is_empty() {
                let mut a: Vec<&mut Seq> = seqs
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| arriving.contains(i))
                    .map(|(_, s)| s)
                    .collect();
                prefill(m, &caches[ci], &mut a)?;
            }
            let mut running: Vec<&mut Seq> = seqs
                .iter_mut()
                .enumerate()
                .filter(|(i, s)| i * 3 <= step && s.tokens.len() < prompt_len[*i] + len(*i))
                .map(|(_, s)| s)
                .collect();
            if running.is_empty() && step > 3 * count {
                break;
            }
            if running.is_empty() {
                continue;
            }
            sizes.insert(running.len());
            decode(m, &caches[ci], path, &mut running)?;
        }
        results.push(seqs.into_iter().map(|s| s.tokens).collect::<Vec<_>>());
    }
    let equal = results[0]
        .iter()
        .zip(&results[1])
        .filter(|(a, b)| a == b)
        .count();
    let ok = equal == count;
    *fails += u32::from(!ok);
    println!(
        "shrink/grow: batch sizes {}..{} over the run; {equal}/{count} sequences with equal tokens{}",
        sizes.first().unwrap_or(&0),
        sizes.last().unwrap_or(&0),
        if ok { "" } else { " FAIL" }
    );
    Ok(())
}

fn main() -> Res<()> {
    policy_serve::init_logging("warn");
    let a = Args::parse();
    let dev = select_device(DeviceChoice::Cuda(0))?;
    let cfg = ModelConfig::from_file(&a.model_dir.join("config.json"))?;
    let weights = policy_serve::engine::model::files::safetensors_in(&a.model_dir)?;
    let m = load_shard(
        "check",
        &cfg,
        &weights,
        DTypeChoice::BF16,
        &dev,
        Shard::FULL,
        &a.kernels.options(),
        || {},
    )?;
    if let Some(file) = &a.timeline {
        #[cfg(feature = "timeline")]
        return timeline::run(&m, &cfg, &dev, 1, file);
        #[cfg(not(feature = "timeline"))]
        return Err(format!(
            "--timeline {} needs a build with the timeline feature (--features nccl,timeline)",
            file.display()
        )
        .into());
    }
    if !a.profile.is_empty() {
        // The launch paths the model was loaded with.
        let ours = policy_serve::engine::model::forward::launch_options(&a.kernels.options(), &cfg);
        return profile::run(&m, &cfg, &dev, (&a.profile, &a.profile_skip), &ours);
    }
    let mut fails = 0u32;
    if a.rows_check {
        rows::rows_check(&cfg, &dev, &mut fails)?;
        println!("graph-check: {fails} failed");
        std::process::exit(i32::from(fails > 0));
    }
    if a.stress_only {
        drop(m);
        stress_check(&a, &mut fails)?;
        println!("graph-check: {fails} failed");
        std::process::exit(i32::from(fails > 0));
    }
    {
        let caches = [
            PagedKvCache::new(&cfg, m.local_kv_heads(), 256 * 22, BS, DType::BF16, &dev)?,
            PagedKvCache::new(&cfg, m.local_kv_heads(), 256 * 22, BS, DType::BF16, &dev)?,
        ];
        // Verify steps of K = 4 for 1..=8 sequences (check 1's second half).
        let verify: Vec<usize> = (1..=8).map(|n| n * 5).collect();
        let mut g = DecodeGraphs::allocate(&m, (256, 256), served_context(&cfg), BS, &verify)?
            .ok_or("no kernels")?;
        g.capture(&m, &caches[1], true, None)?;
        println!(
            "# buckets {:?} (expected {:?} and the verify sizes {verify:?}) captured in {:.0} ms; {:.0} MiB of buffers and graphs",
            g.buckets(),
            graph_buckets(256, 256),
            g.capture_secs() * 1e3,
            g.bytes() as f64 / (1u64 << 20) as f64
        );
        let t = Instant::now();
        let how = (!a.kernels.no_fused_decode, a.kernels.shared_kv_verify);
        if a.verify_only {
            verify::verify_check(&m, &caches, &g, how, &mut fails)?;
            println!("graph-check: {fails} failed");
            std::process::exit(i32::from(fails > 0));
        }
        buckets_check(&m, &caches, &g, &mut fails)?;
        println!("# ({:.0} s)", t.elapsed().as_secs_f64());
        verify::verify_check(&m, &caches, &g, how, &mut fails)?;
        let t = Instant::now();
        shrink_grow_check(&m, &caches, &g, &mut fails)?;
        println!("# ({:.0} s)", t.elapsed().as_secs_f64());
    }
    drop(m);
    let t = Instant::now();
    engine_check(&a, &mut fails)?;
    println!("# ({:.0} s)", t.elapsed().as_secs_f64());
    stress_check(&a, &mut fails)?;
    println!("graph-check: {fails} failed");
    if fails > 0 {
        std::process::exit(1);
    }
    Ok(())
}
