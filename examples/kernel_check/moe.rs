//! The MoE kernels (`kernels/moe.cu`) against the candle-op experts on the same routing:
//! router logits given, routed on the host for the reference (softmax, top-k as HF), every
//! tile kind (narrow tiles of decode, the wide ones of prefill: tensor cores in bf16), one
//! rank's half of the experts (expert parallelism), both `norm_topk_prob` values.

use super::*;
use policy_serve::engine::model::moe::{experts_forward, route};

pub(super) fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let k = CudaKernels::new(dev, DType::BF16, &LaunchOptions::default())?.ok_or("no kernels")?;
    let kf = CudaKernels::new(dev, DType::F32, &LaunchOptions::default())?.ok_or("no kernels")?;
    // (tokens, experts, top-k, hidden, inter, first expert, local experts, norm)
    let cases = [
        (1, 128, 8, 2048, 768, 0, 128, true),
        (5, 128, 8, 2048, 768, 0, 128, false),
        (64, 128, 8, 2048, 768, 0, 128, true),
        (300, 128, 8, 2048, 768, 0, 128, true),
        (300, 128, 8, 2048, 768, 64, 64, true),
        (7, 8, 2, 256, 64, 4, 4, false),
        (600, 8, 2, 256, 64, 0, 8, true),
    ];
    for (tokens, e, top, hidden, inter, first, local, norm) in cases {
        for (dt, kk) in [(DType::BF16, &k), (DType::F32, &kf)] {
            let (h, logits, gu, dn) = layer(dev, dt, (tokens, e), (hidden, inter, local))?;
            let probs = candle_nn::ops::softmax_last_dim(&logits.to_dtype(DType::F32)?)?
                .to_vec2::<f32>()?;
            let mut routing = route(&probs, top, norm);
            // HF rounds the weights to the compute dtype (the kernels too).
            routing.weights = Tensor::new(routing.weights.as_slice(), dev)?
                .to_dtype(dt)?
                .to_dtype(DType::F32)?
                .to_vec1()?;
            let theirs = experts_forward(&h, (&gu, &dn), (first, top), &routing)?;
            let tol = if dt == DType::F32 { 1e-5 } else { 2e-2 };
            // The tile the launcher picks, and in bf16 the others of decode steps too.
            let tiles: &[Option<usize>] = if dt == DType::BF16 {
                &[None, Some(1), Some(8), Some(16)]
            } else {
                &[None]
            };
            let how = (first, top, norm);
            for &tile in tiles {
                let (ours, ..) = kk.moe_experts(&h, &logits, (&gu, &dn), how, (tile, 1))?;
                t.check(
                    format!("moe {dt:?} T{tokens} E{e} top{top} h{hidden} i{inter} experts {first}+{local} norm {norm} tile {tile:?}"),
                    rel(&ours, &theirs)?,
                    tol,
                );
            }
        }
    }
    norm_router(&k, dev, t)?;
    down_sum(dev, t)?;
    route_one(dev, t)?;
    gate_up_cs(dev, t)?;
    timings(&k, dev)
}

/// The one-pair gate|up loading its weights evict-first (`LaunchOptions::moe_gate_up_cs`)
/// against the plain loads: the experts' output bit for bit (an evict-first load reads the
/// same values; a kernel reading its arguments out of step with the launcher's fails it) at 1,
/// 2, 5 (one rank's half of the experts) and 8 tokens of the 30B-A3B shape and a top-2 shape;
/// then both timed alone. The baseline is built with the option off whatever the default, so
/// it never meets itself; the check that the option's kernel is loaded keeps it from passing
/// by falling back.
fn gate_up_cs(dev: &Device, t: &mut Table) -> Res<()> {
    let with = |moe_gate_up_cs: bool| -> Res<CudaKernels> {
        let opts = LaunchOptions {
            moe_gate_up_cs,
            ..LaunchOptions::default()
        };
        Ok(CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?)
    };
    let (k, kc) = (with(false)?, with(true)?);
    t.check(
        "moe gate|up evict-first kernel loaded ?".to_string(),
        if kc.moe_gate_up_cs() && !k.moe_gate_up_cs() {
            0.0
        } else {
            1.0
        },
        0.0,
    );
    one_pair_bits(dev, t, &[("moe gate|up evict-first = plain", &kc, &k)])?;
    let (e, top, hidden, inter) = (128, 8, 2048, 768);
    for tokens in [1usize, 8] {
        let (h, logits, gu, dn) = layer(dev, DType::BF16, (tokens, e), (hidden, inter, e))?;
        let how = (0, top, true);
        let (_, plain, each) = k.moe_experts(&h, &logits, (&gu, &dn), how, (Some(1), 20))?;
        let (_, cs, each_cs) = kc.moe_experts(&h, &logits, (&gu, &dn), how, (Some(1), 20))?;
        println!(
            "moe timing T{tokens} gate|up evict-first (alone, L2-warm): plain {plain:.1} us (gate|up {:.1}), evict-first {cs:.1} ({:.1})",
            each[1], each_cs[1]
        );
    }
    Ok(())
}

/// Each (label, ours, base) of `checks`: the experts' output of `ours` against `base`'s bit for
/// bit on one-pair tiles, on the same inputs, at 1, 2, 5 (one rank's half of the experts) and 8
/// tokens of the 30B-A3B shape and 7 tokens of a top-2 shape, both `norm_topk_prob`.
fn one_pair_bits(
    dev: &Device,
    t: &mut Table,
    checks: &[(&str, &CudaKernels, &CudaKernels)],
) -> Res<()> {
    let cases = [
        (1, 128, 8, 2048, 768, 0, 128, true),
        (2, 128, 8, 2048, 768, 0, 128, false),
        (5, 128, 8, 2048, 768, 64, 64, true),
        (8, 128, 8, 2048, 768, 0, 128, true),
        (7, 8, 2, 256, 64, 4, 4, false),
    ];
    for (tokens, e, top, hidden, inter, first, local, norm) in cases {
        let (h, logits, gu, dn) = layer(dev, DType::BF16, (tokens, e), (hidden, inter, local))?;
        let how = (first, top, norm);
        for &(label, ours, base) in checks {
            let (a, ..) = ours.moe_experts(&h, &logits, (&gu, &dn), how, (Some(1), 1))?;
            let (b, ..) = base.moe_experts(&h, &logits, (&gu, &dn), how, (Some(1), 1))?;
            t.check(
                format!(
                    "{label}: T{tokens} E{e} top{top} h{hidden} experts {first}+{local} norm {norm}"
                ),
                rel(&a, &b)?,
                0.0,
            );
        }
    }
    Ok(())
}

/// Random inputs of one sparse layer's experts in `dt`: `h` `[tokens, hidden]`, router logits
/// `[tokens, e]`, and `local` experts' gate|up `[local, 2 * inter, hidden]` and down `[local,
/// hidden, inter]` (times 0.02).
fn layer(
    dev: &Device,
    dt: DType,
    (tokens, e): (usize, usize),
    (hidden, inter, local): (usize, usize, usize),
) -> Res<(Tensor, Tensor, Tensor, Tensor)> {
    Ok((
        randn(&[tokens, hidden], dt, dev)?,
        randn(&[tokens, e], dt, dev)?,
        (randn(&[local, 2 * inter, hidden], dt, dev)? * 0.02)?,
        (randn(&[local, hidden, inter], dt, dev)? * 0.02)?,
    ))
}

/// Down and the experts' sum in one launch (`LaunchOptions::moe_down_sum`) against the two
/// launches on the same one-pair tiles: bit for bit (the same sums in the same order), at 1,
/// 2, 5 and 8 tokens of the 30B-A3B shape, one rank's half of the experts, a small shape with
/// top-2; the one launch with the experts ranked by one warp (`LaunchOptions::moe_rank_sort`)
/// against it the same way; then the three timed at 1, 2 and 8 tokens.
fn down_sum(dev: &Device, t: &mut Table) -> Res<()> {
    // The one launch is the default; `k` runs the two.
    let opts = LaunchOptions {
        moe_down_sum: false,
        ..LaunchOptions::default()
    };
    let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
    // The one launch with the insertion sort (`kd`) and with the ranks (`kr`), whatever the
    // default.
    let one = |moe_rank_sort: bool| -> Res<CudaKernels> {
        let o = LaunchOptions {
            moe_down_sum: true,
            moe_rank_sort,
            ..LaunchOptions::default()
        };
        Ok(CudaKernels::new(dev, DType::BF16, &o)?.ok_or("no kernels")?)
    };
    let (kd, kr) = (one(false)?, one(true)?);
    // One-pair tiles (asked for below) take the one launch whenever it is loaded.
    t.check(
        "moe down+sum kernel loaded ?".to_string(),
        if kd.moe_down_sum() && !k.moe_down_sum() {
            0.0
        } else {
            1.0
        },
        0.0,
    );
    one_pair_bits(
        dev,
        t,
        &[
            ("moe down+sum in one launch = two", &kd, &k),
            ("moe down+sum ranked by a warp = sorted", &kr, &kd),
        ],
    )?;
    let (e, top, hidden, inter) = (128, 8, 2048, 768);
    let gu = (randn(&[e, 2 * inter, hidden], DType::BF16, dev)? * 0.02)?;
    let dn = (randn(&[e, hidden, inter], DType::BF16, dev)? * 0.02)?;
    for tokens in [1usize, 2, 8] {
        let h = randn(&[tokens, hidden], DType::BF16, dev)?;
        let logits = randn(&[tokens, e], DType::BF16, dev)?;
        let how = (0, top, true);
        let (_, two, each) = k.moe_experts(&h, &logits, (&gu, &dn), how, (Some(1), 20))?;
        let (_, one, _) = kd.moe_experts(&h, &logits, (&gu, &dn), how, (Some(1), 20))?;
        let (_, rk, _) = kr.moe_experts(&h, &logits, (&gu, &dn), how, (Some(1), 20))?;
        println!(
            "moe timing T{tokens} tile 1: down+sum in one launch {one:.1} us a layer's experts, \
             ranked by a warp {rk:.1}, two launches {two:.1} (down {:.1} + sum {:.1} alone)",
            each[2], each[3]
        );
    }
    Ok(())
}

/// One token's routing and alignment by one warp (`LaunchOptions::moe_route_one`) against the
/// block of 1,024 threads: the experts' output bit for bit (the same ids, weights, order and
/// tiles feed them) on every tile kind a one-token step can take, both `norm_topk_prob`, one
/// rank's half of the experts, a top-2 shape; then the routing stage timed both ways.
fn route_one(dev: &Device, t: &mut Table) -> Res<()> {
    let opts = LaunchOptions {
        moe_route_one: false,
        ..LaunchOptions::default()
    };
    let kb = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
    // The one warp's picks by shuffle rounds, and by warp reductions
    // (`LaunchOptions::moe_route_redux`), each named, so neither meets the default by accident.
    let shuffles = LaunchOptions {
        moe_route_one: true,
        moe_route_redux: false,
        ..LaunchOptions::default()
    };
    let kw = CudaKernels::new(dev, DType::BF16, &shuffles)?.ok_or("no kernels")?;
    let kf = CudaKernels::new(dev, DType::F32, &opts)?.ok_or("no kernels")?;
    let kfw = CudaKernels::new(dev, DType::F32, &shuffles)?.ok_or("no kernels")?;
    let rx = LaunchOptions {
        moe_route_one: true,
        moe_route_redux: true,
        ..LaunchOptions::default()
    };
    let kr = CudaKernels::new(dev, DType::BF16, &rx)?.ok_or("no kernels")?;
    let kfr = CudaKernels::new(dev, DType::F32, &rx)?.ok_or("no kernels")?;
    let cases = [
        (128, 8, 2048, 768, 0, 128, true),
        (128, 8, 2048, 768, 0, 128, false),
        (128, 8, 2048, 768, 64, 64, true),
        (8, 2, 256, 64, 4, 4, false),
        (60, 4, 256, 64, 0, 60, true),
    ];
    for (e, top, hidden, inter, first, local, norm) in cases {
        for (dt, block, warp, redux) in
            [(DType::BF16, &kb, &kw, &kr), (DType::F32, &kf, &kfw, &kfr)]
        {
            let (h, logits, gu, dn) = layer(dev, dt, (1, e), (hidden, inter, local))?;
            let how = (first, top, norm);
            let tiles: &[Option<usize>] = if dt == DType::BF16 {
                &[None, Some(1), Some(8), Some(16)]
            } else {
                &[None]
            };
            for &tile in tiles {
                let (a, ..) = block.moe_experts(&h, &logits, (&gu, &dn), how, (tile, 1))?;
                let (b, ..) = warp.moe_experts(&h, &logits, (&gu, &dn), how, (tile, 1))?;
                t.check(
                    format!("moe route by one warp = block: {dt:?} T1 E{e} top{top} h{hidden} experts {first}+{local} norm {norm} tile {tile:?}"),
                    rel(&a, &b)?,
                    0.0,
                );
                let (c, ..) = redux.moe_experts(&h, &logits, (&gu, &dn), how, (tile, 1))?;
                t.check(
                    format!("moe route by warp reductions = block: {dt:?} T1 E{e} top{top} h{hidden} experts {first}+{local} norm {norm} tile {tile:?}"),
                    rel(&a, &c)?,
                    0.0,
                );
            }
        }
    }
    let (e, top, hidden, inter) = (128, 8, 2048, 768);
    let (h, logits, gu, dn) = layer(dev, DType::BF16, (1, e), (hidden, inter, e))?;
    let how = (0, top, true);
    let (_, whole_b, each_b) = kb.moe_experts(&h, &logits, (&gu, &dn), how, (None, 20))?;
    let (_, whole_w, each_w) = kw.moe_experts(&h, &logits, (&gu, &dn), how, (None, 20))?;
    let (_, whole_r, each_r) = kr.moe_experts(&h, &logits, (&gu, &dn), how, (None, 20))?;
    println!(
        "moe timing T1 routing: one warp {:.1} us alone ({whole_w:.1} us a layer's experts), \
         by warp reductions {:.1} ({whole_r:.1}), block of 1,024 {:.1} ({whole_b:.1})",
        each_w[0], each_r[0], each_b[0]
    );
    Ok(())
}

/// The add+RMSNorm and the router's matmul in one launch (`LaunchOptions::moe_norm_router`)
/// against the two launches it replaces: the normed rows, the residual sums and the logits,
/// 1 and 2 rows of the 30B-A3B shape.
fn norm_router(k: &CudaKernels, dev: &Device, t: &mut Table) -> Res<()> {
    let opts = LaunchOptions {
        moe_norm_router: true,
        ..LaunchOptions::default()
    };
    let kn = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
    let (hidden, e, eps) = (2048, 128, 1e-6);
    for rows in [1usize, 2] {
        let res = randn(&[rows, hidden], DType::BF16, dev)?;
        let delta = randn(&[rows, hidden], DType::BF16, dev)?;
        let nw = randn(&[hidden], DType::BF16, dev)?;
        let router = (randn(&[e, hidden], DType::BF16, dev)? * 0.02)?;
        let zeros = |r: usize, c: usize| Tensor::zeros((r, c), DType::BF16, dev);
        let (h1, ro1, l1) = (zeros(rows, hidden)?, zeros(rows, hidden)?, zeros(rows, e)?);
        let (h2, ro2, l2) = (zeros(rows, hidden)?, zeros(rows, hidden)?, zeros(rows, e)?);
        k.add_rmsnorm_to(Some(&delta), &res, &ro1, &nw, eps, &h1)?;
        k.linear_into(&h1, &router, &l1)?;
        let ran =
            kn.moe_norm_router_into((&res, Some(&delta), &ro2), (&nw, eps), &h2, &router, &l2)?;
        let name = |what: &str| format!("moe norm+router in one launch, {rows} rows: {what}");
        t.holds(name("launched"), ran);
        t.check(name("residual sums"), rel(&ro2, &ro1)?, 0.0);
        t.check(name("normed rows"), rel(&h2, &h1)?, 1e-2);
        t.check(name("router logits"), rel(&l2, &l1)?, 2e-2);
    }
    Ok(())
}

/// Wall time of one sparse layer's experts (routing from given logits to the summed output)
/// in the Qwen3-30B-A3B shape, bf16, per tile kind: µs, the expert weights' bytes
/// a run must read over that time, and each launch alone (routing, gate|up, down, sum).
fn timings(k: &CudaKernels, dev: &Device) -> Res<()> {
    let (e, top, hidden, inter) = (128, 8, 2048, 768);
    let gu = (randn(&[e, 2 * inter, hidden], DType::BF16, dev)? * 0.02)?;
    let dn = (randn(&[e, hidden, inter], DType::BF16, dev)? * 0.02)?;
    for tokens in [1usize, 2, 8, 64, 256, 2048] {
        let h = randn(&[tokens, hidden], DType::BF16, dev)?;
        let logits = randn(&[tokens, e], DType::BF16, dev)?;
        let probs =
            candle_nn::ops::softmax_last_dim(&logits.to_dtype(DType::F32)?)?.to_vec2::<f32>()?;
        let r = route(&probs, top, true);
        let mut used = r.experts.clone();
        used.sort_unstable();
        used.dedup();
        let bytes = used.len() * 3 * inter * hidden * 2;
        for tile in [1usize, 8, 16, 64] {
            if tile == 1 && tokens > 64 {
                continue; // every pair reads its expert's rows: seconds at 2,048 tokens
            }
            let how = (0, top, true);
            let (_, us, each) = k.moe_experts(&h, &logits, (&gu, &dn), how, (Some(tile), 20))?;
            println!(
                "moe timing T{tokens} tile {tile}: {us:.1} us, {} experts, {:.0} MB -> {:.2} TB/s \
                 (alone: route {:.1}, gate_up {:.1}, down {:.1}, sum {:.1} us)",
                used.len(),
                bytes as f64 / 1e6,
                bytes as f64 / us / 1e6,
                each[0],
                each[1],
                each[2],
                each[3]
            );
        }
    }
    Ok(())
}
