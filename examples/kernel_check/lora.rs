//! LoRA checks: the kernel forward with adapters in two slots against the candle-op forward
//! on the same weights and adapters (mixed batches: prefill and decode rows on each slot and
//! on the base; 1- and 2-row steps), and greedy tokens of two engines with adapters, CUDA
//! graphs on and off (the adapters' graphs against eager steps).

use super::*;
use policy_serve::engine::LoraOptions;
use policy_serve::engine::model::lora::LoraAdapter;
use policy_serve::engine::model::lora_slots::{LoraSlots, SlotImage};

/// Two random rank-16 adapters for the model of `cfg`, written under the temp dir.
fn adapters(cfg: &ModelConfig) -> Res<Vec<std::path::PathBuf>> {
    (0..2)
        .map(|i| {
            let dir = std::env::temp_dir().join(format!("kc-lora-{}-{i}", std::process::id()));
            policy_serve::testing::write_random_adapter(&dir, cfg, 16, 0.05)?;
            Ok(dir)
        })
        .collect()
}

pub(super) fn lora_model_checks(a: &Args, dev: &Device, dt: DType, t: &mut Table) -> Res<()> {
    let cfg = ModelConfig::from_file(&a.model_dir.join("config.json"))?;
    let weights = policy_serve::engine::model::files::safetensors_in(&a.model_dir)?;
    let dirs = adapters(&cfg)?;
    // The kernels as the flags say, with the shrinks beside the base matmuls, the candle ops,
    // and the candle ops in f32 (the reference: bf16 logits are held to their distance from
    // it, not to another bf16 rounding's); then the grouped kernels, alone and with the
    // overlap; then the run shrink with the overlap; then the shrinks inside the base matmuls
    // (the wide layout, `KernelOptions::lora_wide`).
    let load = |kernels: bool,
                (overlap, grouped, runs, wide): (bool, bool, bool, bool),
                dt: DType|
     -> Res<policy_serve::engine::model::Model> {
        let opts = KernelOptions {
            lora_overlap: overlap,
            lora_grouped: grouped,
            lora_runs: runs,
            // Every step of up to 64 rows (the 1-2 row steps too, not by default).
            lora_wide: wide.then_some(1),
            ..a.kernels.options()
        };
        let choice = dtype_choice(dt);
        let mut m = load_shard(
            "lora",
            &cfg,
            &weights,
            choice,
            dev,
            Shard::FULL,
            &opts,
            || {},
        )?;
        if !kernels {
            m.disable_kernels();
        }
        m.set_lora_slots(LoraSlots::new(&cfg, 2, 16, m.dtype(), dev)?);
        if wide {
            m.widen_lora_slots()?;
        }
        for (i, d) in dirs.iter().enumerate() {
            let ad = LoraAdapter::load(d, &cfg, 16)?;
            let image = SlotImage::new(&ad, &cfg, 16, m.dtype())?;
            m.lora_slots().ok_or("slots")?.load(i, &image)?;
        }
        Ok(m)
    };
    let (fast, overlap) = (
        load(true, (false, false, false, false), dt)?,
        load(true, (true, false, false, false), dt)?,
    );
    let slow = load(false, (false, false, false, false), dt)?;
    let reference = load(false, (false, false, false, false), DType::F32)?;
    let grouped = load(true, (false, true, false, false), dt)?;
    let grouped_overlap = load(true, (true, true, false, false), dt)?;
    let runs = load(true, (true, false, true, false), dt)?;
    let wide = load(true, (true, false, true, true), dt)?;
    let bs = 16;
    let slots = [Some(0u32), None, Some(1), Some(0), None, Some(1)];
    let mut out = Vec::new();
    for m in [
        &fast,
        &overlap,
        &slow,
        &reference,
        &grouped,
        &grouped_overlap,
        &runs,
        &wide,
    ] {
        let c = PagedKvCache::new(&cfg, m.local_kv_heads(), 256, bs, m.dtype(), dev)?;
        let tables: Vec<Vec<u32>> = (0..6u32)
            .map(|i| (0..12).map(|j| i * 12 + j).collect())
            .collect();
        let lens: Vec<usize> = (0..6).map(|i| 40 + i * 23).collect();
        // One mixed prefill step: six prompts, two per slot and two on the base.
        let toks: Vec<u32> = (0..6)
            .flat_map(|i| synthetic_prompt(lens[i], 70 + i))
            .collect();
        let seqs: Vec<SeqInput<'_>> = (0..6)
            .map(|i| SeqInput {
                q_len: lens[i],
                context_len: lens[i],
                block_table: &tables[i],
                logits: LogitRows::Last,
                adapter: slots[i],
            })
            .collect();
        let l1 = m.forward(&toks, &seqs, &c, None)?.ok_or("logits")?;
        let mut steps = vec![l1];
        // Decode steps of 6, 1 and 2 rows (the 1-2 row steps take the skinny matmuls).
        for (round, rows) in [(1usize, 0..6usize), (2, 2..3), (3, 3..5)] {
            let s: Vec<SeqInput<'_>> = rows
                .clone()
                .map(|i| SeqInput {
                    q_len: 1,
                    context_len: lens[i] + round,
                    block_table: &tables[i],
                    logits: LogitRows::Last,
                    adapter: slots[i],
                })
                .collect();
            let tk: Vec<u32> = rows.map(|i| 3000 + 10 * round as u32 + i as u32).collect();
            steps.push(m.forward(&tk, &s, &c, None)?.ok_or("logits")?);
        }
        // A prefill step of 39 tokens (one-token tiles: the overlap's, and more rows than
        // the grouped shrink's minimum) over three new prompts on slot 0, the base and slot 1.
        let more: Vec<Vec<u32>> = (0..3u32)
            .map(|i| (0..4).map(|j| 100 + i * 4 + j).collect())
            .collect();
        let (plens, pslots) = ([13usize, 17, 9], [Some(0u32), None, Some(1)]);
        let toks: Vec<u32> = (0..3)
            .flat_map(|i| synthetic_prompt(plens[i], 90 + i))
            .collect();
        let s: Vec<SeqInput<'_>> = (0..3)
            .map(|i| SeqInput {
                q_len: plens[i],
                context_len: plens[i],
                block_table: &more[i],
                logits: LogitRows::Last,
                adapter: pslots[i],
            })
            .collect();
        steps.push(m.forward(&toks, &s, &c, None)?.ok_or("logits")?);
        out.push(steps);
    }
    let tl = if dt == DType::F32 { 1e-4 } else { 3e-2 };
    for (i, what) in [
        "prefill 6 mixed",
        "decode 6 mixed",
        "decode 1 (slot 1)",
        "decode 2 (slot 0, base)",
        "prefill 3 x 9-17 mixed",
    ]
    .iter()
    .enumerate()
    {
        let candle = rel(&out[2][i], &out[3][i])?;
        t.check(
            format!("lora {dt:?}: {what} (candle {dt:?} {candle:.2e})"),
            rel(&out[0][i], &out[3][i])?,
            tl,
        );
        // The overlap runs the same kernels in the same order of sums: bit for bit.
        t.check(
            format!("lora {dt:?} overlap = serial: {what}"),
            rel(&out[1][i], &out[0][i])?,
            0.0,
        );
        // The grouped shrink sums in another order (f32): held to the reference like the
        // serial path; with the overlap it feeds the same fused expands: bit for bit.
        t.check(
            format!("lora {dt:?} grouped: {what}"),
            rel(&out[4][i], &out[3][i])?,
            tl,
        );
        t.check(
            format!("lora {dt:?} grouped overlap = grouped: {what}"),
            rel(&out[5][i], &out[4][i])?,
            0.0,
        );
        // The run shrink takes the 39-row step only (17-64 rows; it sums in another order):
        // held to the reference there, bit for bit the overlap's elsewhere.
        let (rref, rtol) = if i == 4 { (3, tl) } else { (1, 0.0) };
        t.check(
            format!("lora {dt:?} runs: {what}"),
            rel(&out[6][i], &out[rref][i])?,
            rtol,
        );
        // The wide matmul rounds y to the compute dtype (the shrink kernels keep it f32):
        // held to the reference like the serial path, its distance from the overlap printed.
        // Steps of more than 64 rows (the 6-prompt prefill) never take it: bit for bit the
        // run shrink's there.
        let off = rel(&out[7][i], &out[6][i])?;
        let (wref, wtol) = if i == 0 { (6, 0.0) } else { (3, tl) };
        t.check(
            format!("lora {dt:?} wide: {what} (from the runs {off:.2e})"),
            rel(&out[7][i], &out[wref][i])?,
            wtol,
        );
    }
    // Positive control: the same prompt through slot 0 and on the base differ.
    let c = PagedKvCache::new(&cfg, fast.local_kv_heads(), 16, bs, dt, dev)?;
    let table: Vec<u32> = (0..8).collect();
    let p = synthetic_prompt(64, 9);
    let run = |adapter| -> Res<Tensor> {
        let s = [SeqInput {
            q_len: 64,
            context_len: 64,
            block_table: &table,
            logits: LogitRows::Last,
            adapter,
        }];
        Ok(fast.forward(&p, &s, &c, None)?.ok_or("logits")?)
    };
    let differ = rel(&run(Some(0))?, &run(None)?)?;
    t.holds(
        format!("lora {dt:?}: adapter changes the logits (rel {differ:.3}) ?"),
        differ > 1e-2,
    );
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(())
}

/// Greedy tokens of 12 requests on two adapters and the base, with CUDA graphs and without:
/// equal token for token (the same kernels run in both; steps of 9-12 rows take the overlap's
/// second stream, `lora_side_min_rows` 8, captured as a branch of the graph); and of 32 short
/// requests in lockstep (one prefill step, then 32-row decode steps, the graphs' bucket of 32)
/// with the run shrink (`KernelOptions::lora_runs`) and without it.
pub(super) fn lora_graph_check(a: &Args, t: &mut Table) -> Res<()> {
    const N: usize = 12;
    let cfg = ModelConfig::from_file(&a.model_dir.join("config.json"))?;
    let dirs = adapters(&cfg)?;
    let run = |graphs: bool,
               (lora_overlap, lora_grouped, lora_runs, lora_wide): (bool, bool, bool, bool),
               n: usize|
     -> Res<Vec<Vec<u32>>> {
        let base = a.kernels.options();
        let opts = EngineOptions {
            device: DeviceChoice::Cuda(0),
            dtype: DTypeChoice::BF16,
            cuda_graphs: graphs,
            max_running: Some(64),
            lora: Some(LoraOptions {
                max_loras: 2,
                max_lora_rank: 16,
            }),
            kernels: KernelOptions {
                lora_overlap,
                lora_grouped,
                lora_runs,
                lora_wide: lora_wide.then_some(1),
                // The 12 requests' steps of 9-12 rows take the second stream (not by default:
                // `lora_side_min_rows`), the 32 requests' the flags' bound.
                lora_side_min_rows: if n > N { base.lora_side_min_rows } else { 8 },
                ..base
            },
            ..EngineOptions::default()
        };
        let (_r, e) = engine(a, opts)?;
        let hs = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| e.load_adapter(&format!("a{i}"), d))
            .collect::<Result<Vec<_>, _>>()?;
        let requests = (0..n).map(|i| {
            // Many requests: short prompts (about 2k tokens in all, one prefill step), so every
            // decode step holds them all.
            let len = if n > N { 30 + (i % 8) * 9 } else { 30 + i * 41 };
            let mut req = GenerationRequest::new(synthetic_prompt(len, 600 + i)).max_new_tokens(32);
            req.ignore_eos = true;
            req.adapter = (i % 3 < 2).then(|| hs[i % 3].clone());
            req
        });
        tokens_of(&e, requests)
    };
    let mut eagers = Vec::new();
    // The run shrink with 32 requests: their decode steps (32 rows, the graphs' bucket of 32)
    // are steps it takes (qkv and gate|up), eager and replayed; and the same without it.
    for (variant, n) in [
        ((false, false, false, false), N),
        ((true, false, false, false), N),
        ((false, true, false, false), N),
        ((true, false, true, false), 32),
        ((true, false, false, false), 32),
        ((true, false, true, true), N),
        ((true, false, true, true), 32),
    ] {
        let (graphs, eager) = (run(true, variant, n)?, run(false, variant, n)?);
        let equal = graphs.iter().zip(&eager).filter(|(g, e)| g == e).count();
        let how = match (variant, n > N) {
            ((_, _, _, true), true) => " (wide, 32 requests)",
            ((_, _, _, true), _) => " (wide)",
            ((_, _, true, _), _) => " (runs)",
            (_, true) => " (overlap, 32 requests)",
            ((true, _, _, _), _) => " (overlap)",
            ((_, true, _, _), _) => " (grouped)",
            _ => "",
        };
        println!("lora greedy graphs vs eager{how}: {equal}/{n} requests equal");
        t.holds(
            format!("lora graphs vs eager{how}: {equal}/{n} greedy answers equal ?"),
            equal == n,
        );
        if n == N {
            eagers.push(eager);
        }
    }
    // Requests whose eager answers under variant `i` equal the serial path's.
    let same_as_serial = |i: usize| {
        eagers[0]
            .iter()
            .zip(&eagers[i])
            .filter(|(a, b)| a == b)
            .count()
    };
    // The overlap computes the same sums in the same order (its expand+SiLU rounds where the
    // two launches round): the answers are equal.
    let same = same_as_serial(1);
    println!("lora greedy overlap vs serial (eager): {same}/{N} requests equal");
    t.holds(
        format!("lora overlap vs serial: {same}/{N} greedy answers equal ?"),
        same == N,
    );
    // The grouped shrink rounds differently: printed, not held to equality (its logits are
    // held to the f32 reference in `lora_model_checks`).
    println!(
        "lora greedy grouped vs serial (eager): {}/{N} requests equal",
        same_as_serial(2)
    );
    // The wide matmul rounds y to bf16: printed, not held (its logits are held as above).
    println!(
        "lora greedy wide vs serial (eager): {}/{N} requests equal",
        same_as_serial(3)
    );
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(())
}

/// A tile table case: name, rows, slots held, and the tiles as (token, slot).
pub(super) type TileCase = (&'static str, usize, usize, Vec<(u32, u32)>);

/// The checks' bf16 normals (`super::randn`) scaled by `s`.
pub(super) fn normal(shape: &[usize], s: f64, dev: &Device) -> Res<Tensor> {
    Ok((randn(shape, DType::BF16, dev)? * s)?)
}

/// A slot per row (row i on slot i % 8), the tiles sorted by slot.
pub(super) fn by_slot(rows: usize) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = (0..rows as u32).map(|i| (i, i % 8)).collect();
    v.sort_by_key(|&(_, s)| s);
    v
}

/// The LoRA kernel checks' tables (rows, slots held, tiles as (token, slot); slot ids may
/// exceed the slots held: skipped): a slot per row, one slot for all rows, rows on 13 of 16
/// slots unsorted with base rows (3, 8, 13, ..) and a slot past those held (row 17), and
/// `fewest` rows (the fewest the kernels under check take).
pub(super) fn tile_cases((name, fewest): (&'static str, usize)) -> [TileCase; 4] {
    let scattered: Vec<(u32, u32)> = (0..40u32)
        .filter(|i| i % 5 != 3)
        .map(|i| (i, if i == 17 { 99 } else { (i * 7) % 13 }))
        .collect();
    [
        ("64 rows, a slot per row", 64, 8, by_slot(64)),
        (
            "64 rows on one slot",
            64,
            8,
            (0..64).map(|i| (i, 3)).collect(),
        ),
        ("40 rows on 13 slots, unsorted", 40, 16, scattered),
        (name, fewest, 8, by_slot(fewest)),
    ]
}

/// (name, fan in, projections' output rows) of the LoRA kernel checks: 0.6B qkv / o /
/// gate|up / down, 1.7B down.
pub(super) fn lora_shapes() -> [(&'static str, usize, Vec<usize>); 5] {
    [
        ("qkv 1024", 1024, vec![0, 2048, 3072, 4096]),
        ("o 2048", 2048, vec![0, 1024]),
        ("gate|up 1024", 1024, vec![0, 3072, 6144]),
        ("down 3072", 3072, vec![0, 1024]),
        ("down 6144", 6144, vec![0, 2048]),
    ]
}

/// The flattened tile table (u32 `[tiles, 3]`, one-token tiles) of `table`, with a graph's two
/// count-0 tiles of padding where there is room (a graph's table has a tile a row at most).
pub(super) fn flat_tiles(table: &[(u32, u32)], rows: usize, dev: &Device) -> Res<Tensor> {
    let mut v: Vec<u32> = table.iter().flat_map(|&(i, s)| [i, 1, s]).collect();
    if table.len() + 2 <= rows {
        v.extend([0, 0, 0, 0, 0, 0]);
    }
    let n = v.len() / 3;
    Ok(Tensor::from_vec(v, (n, 3), dev)?)
}

/// The grouped LoRA kernels (`LaunchOptions::lora_grouped`) against the one-token kernels on
/// random adapters: the shrink's `y` within f32 rounding of theirs (the same products summed in
/// another order, on tensor cores, over 1-16 slices of the input features) and the expand bit
/// for bit from the same `y`. Tables: a slot per row sorted by slot, one slot for all rows, rows
/// on 13 of 16 slots unsorted with base rows, count-0 padding and a slot past those held; rank
/// 8 (a partial tile of 16 rows), 16 and 64; the fan-ins of the 0.6B and 1.7B shapes.
pub(super) fn lora_grouped_checks(dev: &Device, t: &mut Table) -> Res<()> {
    use policy_serve::engine::cuda::{LORA_GROUPED_MIN_ROWS, lora_scratch_cols};
    let kern = |grouped: bool| -> Res<CudaKernels> {
        let o = LaunchOptions {
            lora_grouped: grouped,
            lora_runs: false,
            ..LaunchOptions::default()
        };
        Ok(CudaKernels::new(dev, DType::BF16, &o)?.ok_or("kernels")?)
    };
    let (plain, grouped) = (kern(false)?, kern(true)?);
    // Every shrink and expand of the table (not only the shrinks of the rule).
    grouped.set_lora_grouped_everywhere(true);
    let normal = |shape: &[usize], s: f64| normal(shape, s, dev);
    let tables = tile_cases(("9 rows", LORA_GROUPED_MIN_ROWS + 1));
    let shapes = lora_shapes();
    for (tname, rows, slots, table) in &tables {
        let tiles = flat_tiles(table, *rows, dev)?;
        let ntiles = tiles.dim(0)?;
        t.check(
            format!("lora grouped kernels serve {tname} ({ntiles} tiles) ?"),
            if grouped.lora_grouped_serves(*rows, ntiles) {
                0.0
            } else {
                1.0
            },
            0.0,
        );
        for r in [8usize, 16, 64] {
            for (sname, fan_in, splits) in &shapes {
                if r != 16 && !sname.starts_with("qkv") && !sname.starts_with("down 6") {
                    continue;
                }
                let parts = splits.len() - 1;
                let nout = *splits.last().ok_or("splits")?;
                let a = normal(&[*slots, parts * r, *fan_in], 0.05)?;
                let b = normal(&[*slots, nout, r], 0.05)?;
                let x = normal(&[*rows, *fan_in], 1.0)?;
                let cols = lora_scratch_cols(r, true);
                let y_ref = Tensor::zeros((*rows, cols), DType::F32, dev)?;
                let y = Tensor::zeros((*rows, cols), DType::F32, dev)?;
                plain.lora_shrink_into(&x, &a, (&tiles, 1), &y_ref)?;
                let n = rows * parts * r;
                let head = |v: &Tensor| v.flatten_all()?.narrow(0, 0, n);
                let yr = head(&y_ref)?;
                // The rule's slices, then asked for 2 and 16 (taken where the shape can).
                for asked in [None, Some(2), Some(16)] {
                    grouped.set_lora_grouped_slices(asked);
                    y.zero_set()?;
                    grouped.lora_shrink_into(&x, &a, (&tiles, 1), &y)?;
                    t.check(
                        format!("lora grouped shrink: {tname}, {sname}, r{r}, slices {asked:?}"),
                        rel(&head(&y)?, &yr)?,
                        1e-5,
                    );
                }
                grouped.set_lora_grouped_slices(None);
                let out0 = normal(&[*rows, nout], 1.0)?;
                let (o_ref, o_grp) = (out0.copy()?, out0.copy()?);
                plain.lora_expand_into(&y_ref, (&b, splits), (&tiles, 1), &o_ref)?;
                grouped.lora_expand_into(&y_ref, (&b, splits), (&tiles, 1), &o_grp)?;
                t.check(
                    format!("lora grouped expand = one-token: {tname}, {sname}, r{r}"),
                    rel(&o_grp, &o_ref)?,
                    0.0,
                );
            }
        }
    }
    // Positive control: the expand changed the rows on adapters (a step the grouped kernels
    // serve).
    let n = 40;
    let x = normal(&[n, 1024], 1.0)?;
    let a = normal(&[8, 16, 1024], 0.05)?;
    let b = normal(&[8, 1024, 16], 0.05)?;
    let tiles = flat_tiles(&by_slot(n), n, dev)?;
    let y = Tensor::zeros((n, lora_scratch_cols(16, true)), DType::F32, dev)?;
    let out = normal(&[n, 1024], 1.0)?;
    let before = out.copy()?;
    grouped.lora_into(&x, (&a, &b, &[0, 1024]), (&tiles, 1), &y, &out)?;
    let moved = rel(&out, &before)?;
    t.holds(
        format!("lora grouped: the delta moves the output (rel {moved:.3}) ?"),
        moved > 1e-3,
    );
    Ok(())
}
