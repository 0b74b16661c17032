//! `--timeline FILE` (the `timeline` feature's profiling build): one decode step of the
//! engine's 1-row graph (PDL in the graph) recorded block by block (`engine::cuda::timeline`):
//! when each block of each launch started and when its wait on the launch before was released.
//! The records go to FILE as CSV; the summary prints each launch of the step in order, how its
//! blocks' starts and releases lie against the release of the launch before, and the mean over
//! the layers of each kind of launch.

use std::io::Write;

use candle_core::{DType, Device};
use policy_serve::engine::ModelConfig;
use policy_serve::engine::cuda::timeline::{self, BlockRecord};
use policy_serve::engine::model::Model;
use policy_serve::engine::model::kv_cache::PagedKvCache;
use policy_serve::engine::model::loader::served_context;
use policy_serve::engine::runner::graphs::DecodeGraphs;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One launch of the step: its kind (module, grid, threads) and its blocks' times.
struct Launch {
    kind: String,
    blocks: usize,
    start: (u64, u64),
    release: (u64, u64),
}

/// Records steps of batch `b` after `ctx` tokens of context and writes them to `file`.
pub fn run(
    m: &Model,
    cfg: &ModelConfig,
    dev: &Device,
    b: usize,
    file: &std::path::Path,
) -> Res<()> {
    let (bs, ctx) = (16usize, 600usize);
    let per = (ctx + 2 + 64).div_ceil(bs);
    let cache = PagedKvCache::new(cfg, m.local_kv_heads(), b * per, bs, DType::BF16, dev)?;
    let mut g =
        DecodeGraphs::allocate(m, (b, b), served_context(cfg), bs, &[])?.ok_or("no kernels")?;
    g.capture(m, &cache, true, None)?;
    let tables = super::profile::block_tables(b, per);
    let step = |c: usize| super::profile::replay_decode(m, &g, &tables, c).map(drop);
    for i in 0..10 {
        step(ctx + i)?;
    }
    dev.synchronize()?;
    // Two steps back to back, recorded: the second is the steady state (the first follows the
    // host's uploads).
    let tl = timeline::arm(dev, 1 << 18)?;
    step(ctx + 10)?;
    step(ctx + 11)?;
    let (recs, full) = tl.finish()?;
    if !full.is_empty() {
        println!("timeline: records ran out in {full:?} (the second step is cut)");
    }
    let mut f = std::fs::File::create(file)?;
    writeln!(
        f,
        "module,grid_x,grid_y,grid_z,threads,block,sm,phase,start_ns,release_ns"
    )?;
    for r in &recs {
        writeln!(
            f,
            "{},{},{},{},{},{},{},{},{},{}",
            r.module,
            r.grid[0],
            r.grid[1],
            r.grid[2],
            r.threads,
            r.block,
            r.sm,
            r.phase,
            r.start_ns,
            r.release_ns
        )?;
    }
    println!("timeline: {} records into {}", recs.len(), file.display());
    let (blocks, phases): (Vec<BlockRecord>, Vec<BlockRecord>) =
        recs.into_iter().partition(|r| r.phase == 0);
    let launches = launches(&blocks);
    summary(&launches, cfg.num_hidden_layers);
    phase_summary(&launches[launches.len() / 2..], &phases);
    Ok(())
}

/// The phases kernels mark (the fused attention's: `kernels/fused_decode.cu`), each phase's
/// median over the step's launches of that kind: us after the launch's first release, the
/// blocks that marked it.
fn phase_summary(step: &[Launch], phases: &[BlockRecord]) {
    let (Some(first), Some(last)) = (step.first(), step.last()) else {
        return;
    };
    let mut by: std::collections::BTreeMap<(String, u8), Vec<f64>> = Default::default();
    for p in phases {
        if p.release_ns < first.release.0 || p.release_ns > last.release.1 + 1_000_000 {
            continue;
        }
        let kind = kind_of(p);
        // The launch of that kind released last before the mark.
        let Some(l) = step
            .iter()
            .rev()
            .find(|l| l.kind == kind && l.release.0 <= p.release_ns)
        else {
            continue;
        };
        by.entry((kind, p.phase))
            .or_default()
            .push((p.release_ns - l.release.0) as f64 / 1e3);
    }
    if by.is_empty() {
        return;
    }
    println!("| launch kind | phase | marks | median us after the launch's first release | last |");
    println!("|---|---|---|---|---|");
    for ((kind, phase), mut v) in by {
        v.sort_by(|a, b| a.total_cmp(b));
        println!(
            "| {kind} | {phase} | {} | {:.2} | {:.2} |",
            v.len(),
            v[v.len() / 2],
            v[v.len() - 1]
        );
    }
}

/// A record's launch kind: its module, grid and threads a block.
fn kind_of(r: &BlockRecord) -> String {
    let [x, y, z] = r.grid;
    format!("{} {x}x{y}x{z} t{}", r.module, r.threads)
}

/// The launches in release order: a launch's blocks are released together (the launch before
/// has ended), and the next launch's only after all of them finished.
fn launches(recs: &[BlockRecord]) -> Vec<Launch> {
    let mut out: Vec<Launch> = Vec::new();
    for r in recs {
        let kind = kind_of(r);
        match out.last_mut() {
            Some(l) if l.kind == kind && r.release_ns < l.release.0 + 20_000 => {
                l.blocks += 1;
                l.start = (l.start.0.min(r.start_ns), l.start.1.max(r.start_ns));
                l.release = (l.release.0.min(r.release_ns), l.release.1.max(r.release_ns));
            }
            _ => out.push(Launch {
                kind,
                blocks: 1,
                start: (r.start_ns, r.start_ns),
                release: (r.release_ns, r.release_ns),
            }),
        }
    }
    out
}

/// Prints the launches of the second recorded step (the second half of the launches: two
/// steps of the same graph) and each kind's means.
fn summary(ls: &[Launch], layers: usize) {
    if ls.len() < 2 {
        println!("timeline: too few launches recorded ({})", ls.len());
        return;
    }
    let step = &ls[ls.len() / 2..];
    let t0 = step[0].release.0;
    let us = |t: u64| (t as f64 - t0 as f64) / 1e3;
    println!(
        "timeline: {} launches in the step, {} layers",
        step.len(),
        layers
    );
    println!(
        "| # | launch | blocks | first start | last start | first release | last release | since the launch before's release |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut kinds: Vec<(String, f64, f64, f64, usize)> = Vec::new();
    for (i, l) in step.iter().enumerate() {
        let gap = if i == 0 {
            0.0
        } else {
            (l.release.0 - step[i - 1].release.0) as f64 / 1e3
        };
        let early = (l.release.0 as f64 - l.start.0 as f64) / 1e3;
        let late = (l.start.1 as f64 - l.release.0 as f64) / 1e3;
        if i < 16 || i + 6 > step.len() {
            println!(
                "| {i} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {gap:.2} |",
                l.kind,
                l.blocks,
                us(l.start.0),
                us(l.start.1),
                us(l.release.0),
                us(l.release.1),
            );
        }
        match kinds.iter_mut().find(|k| k.0 == l.kind) {
            Some(k) => {
                k.1 += gap;
                k.2 += early;
                k.3 += late;
                k.4 += 1;
            }
            None => kinds.push((l.kind.clone(), gap, early, late, 1)),
        }
    }
    println!(
        "| launch kind | launches | mean us since the launch before's release | mean us its first block waited | mean us its last block started after the release |"
    );
    println!("|---|---|---|---|---|");
    for (k, gap, early, late, n) in kinds {
        let n_f = n as f64;
        println!(
            "| {k} | {n} | {:.2} | {:.2} | {:.2} |",
            gap / n_f,
            early / n_f,
            late / n_f
        );
    }
    println!(
        "timeline: the step's releases span {:.1} us",
        (step[step.len() - 1].release.1 - t0) as f64 / 1e3
    );
}
