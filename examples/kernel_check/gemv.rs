//! The skinny matmuls of decode steps (`kernels/gemv.cu`, `kernels/gemv_mma.cu`): CUDA-core
//! kernels for 1-2 rows and tensor-core kernels for 3-8, plain, with SiLU*up, and behind the
//! fused add+RMSNorm, with the L2 prefetch of a next weight on, against f32 math on the same
//! bf16 inputs. Shapes of Qwen3-0.6B/1.7B layers plus ragged ones (output rows not a multiple
//! of a block's 16); the streamed-rows gate|up kernels and the double-buffered ones (the
//! defaults) against the one-block-a-row-group, one-batch kernels, bit for bit.

use super::*;

pub(super) fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    for (warp_norm, norm_deferred, tag) in [
        (false, None, ""),
        (true, None, " (warp norm)"),
        (false, Some(1 << 20), " (deferred norm)"),
    ] {
        let opts = LaunchOptions {
            gemv_mma: true,
            l2_prefetch: true,
            warp_norm,
            norm_deferred,
            ..LaunchOptions::default()
        };
        let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
        check_with(&k, tag, dev, t)?;
    }
    // The one-block-a-row-group kernels with one batch of loads in flight (no longer the
    // defaults), against which the streamed and double-buffered ones are held (without the
    // streamed 1-row matmul, which would take their 1-row plain matmuls of 2,048+ inputs).
    let base = LaunchOptions {
        gemv_stream: None,
        gemv_stream_stage: false,
        gemv_double_buffer: false,
        gemv_tma: None,
        ..LaunchOptions::default()
    };
    let plain = CudaKernels::new(dev, DType::BF16, &base)?.ok_or("no kernels")?;
    // The streamed gate|up: 1 row the general loop; 2 rows a loop of whole rows at 1,024 and
    // 2,048 inputs, the 2,048 batch refilled by halves as summed. 1 block an SM gives 1.7B's
    // gate|up several batches a warp; at 1,024 inputs (two rows a batch) warps with an odd row
    // count end on a batch cut short at every count; 96 and 6,144 inputs run the general loop.
    for blocks in [1u8, 2, 3] {
        let opts = LaunchOptions {
            gemv_stream: Some(blocks),
            ..base
        };
        let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
        stream_bits(
            &plain,
            &k,
            &format!(" (streamed, {blocks} blocks an SM)"),
            dev,
            t,
        )?;
    }
    // The 1-row gate|up with its second batch staged in shared memory (`gemv_stream_stage`):
    // 1-3 blocks an SM (1.7B's gate|up at 1 has six batches a warp, so the loads after the
    // stage run the loop's later rounds), the scale-first norm and the deferred one over every
    // width the streamed norm takes. The base and the 1-3-block runs above have it off.
    // Held to the base kernels with the same norm (each built once): `base` has the default
    // `norm_deferred` (deferred up to 1,024 inputs), so neither reference is `plain` (round 60:
    // holding the scale-first runs to `plain` failed them at 96 and 1,024 inputs).
    let deferred_norm = Some(1 << 20);
    let with_norm = |norm_deferred| -> Res<CudaKernels> {
        let o = LaunchOptions {
            norm_deferred,
            ..base
        };
        Ok(CudaKernels::new(dev, DType::BF16, &o)?.ok_or("no kernels")?)
    };
    let (plain_first, plain_deferred) = (with_norm(None)?, with_norm(deferred_norm)?);
    for (blocks, deferred) in [(1u8, None), (2, None), (3, None), (2, deferred_norm)] {
        let opts = LaunchOptions {
            gemv_stream: Some(blocks),
            gemv_stream_stage: true,
            norm_deferred: deferred,
            ..base
        };
        let (plain, d) = match deferred {
            Some(_) => (&plain_deferred, ", deferred norm"),
            None => (&plain_first, ""),
        };
        let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
        let loaded = k.gemv_stream_stage_bytes() == Some(8 * 8192)
            && plain.gemv_stream_stage_bytes().is_none();
        t.holds(
            format!("gemv 1-row stage entries loaded ({blocks} blocks an SM{d}) ?"),
            loaded,
        );
        let tag = format!(" (streamed, stage, {blocks} blocks an SM{d})");
        stream_bits(plain, &k, &tag, dev, t)?;
    }
    let opts = LaunchOptions {
        gemv_double_buffer: true,
        ..base
    };
    let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
    double_bits(&plain, &k, dev, t)?;
    mma_plain_dispatch(dev, t)?;
    super::presum::checks(dev, t)?;
    tma_bits(dev, t)?;
    evict_first_bits(dev, t)?;
    split_rows(dev, t)
}

/// The skinny matmuls with their weights evict-first in L2 (`LaunchOptions::weight_evict_first`,
/// the `gemv_ef` / `gemv_mma_ef` builds) against the same kernels without, bit for bit
/// (tolerance 0; a cache policy changes no value, so a kernel of the second build that reads
/// its arguments or rows out of step with the first fails it): plain, SiLU*up and behind the
/// fused norm, 1-8 rows (the CUDA-core and the tensor-core kernels), shapes of 0.6B, 1.7B and
/// the 30B-A3B router. Both are built with the option named, and the check that the option's
/// kernels were loaded keeps it from passing by falling back.
fn evict_first_bits(dev: &Device, t: &mut Table) -> Res<()> {
    let with = |weight_evict_first: bool| -> Res<CudaKernels> {
        let opts = LaunchOptions {
            gemv_mma: true,
            weight_evict_first,
            gemv_x_shared: false,
            gemv_mma_x_stage: false,
            ..LaunchOptions::default()
        };
        Ok(CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?)
    };
    let (plain, ef) = (with(false)?, with(true)?);
    let loaded = ef.weight_evict_first() && !plain.weight_evict_first();
    t.holds("gemv evict-first kernels loaded ?".into(), loaded);
    let shapes = [(1024, 2048), (6144, 1024), (128, 2048), (1000, 4096)];
    let tag = " (weights evict-first)";
    pair_bits(
        (&plain, &ef),
        (&[1, 2, 3, 5, 8], &shapes),
        (true, tag),
        dev,
        t,
    )?;
    // The inputs in shared memory, the defaults' builds, against the evict-first builds
    // (`ef`, the inputs loaded in the loops), bit for bit:
    // - 1-2 rows (`gemv_x_shared`, `gemv_ef_xs`): 1.7B's o and down (2,048 x 2,048 and 6,144:
    //   the double-buffered kernel) and a row past the buffer (2 x 8,192 inputs, read from
    //   global memory): a chunk copied to the wrong place fails it.
    // - 3-8 rows (`gemv_mma_x_stage`, `gemv_mma_ef_xs`): plain and SiLU*up (the norm kernels
    //   are the same code), 0.6B's o and down (a warp's second batch cut short at 3,072
    //   inputs), 1.7B's o and down (three batches a warp) and a ragged shape: a step's chunk
    //   staged in the wrong slot, or read before it landed, fails it; the presummed kernels
    //   are held to it in `presum::checks`.
    let xs = CudaKernels::new(
        dev,
        DType::BF16,
        &LaunchOptions {
            gemv_mma: true,
            ..LaunchOptions::default()
        },
    )?
    .ok_or("no kernels")?;
    for (name, loaded) in [
        (
            "gemv shared-input kernels loaded ?",
            xs.gemv_x_shared() && !ef.gemv_x_shared(),
        ),
        (
            "gemv_mma staged-input kernels loaded ?",
            xs.gemv_mma_x_stage() && !ef.gemv_mma_x_stage(),
        ),
    ] {
        t.holds(name.into(), loaded);
    }
    let shapes = [(2048, 2048), (2048, 6144), (1000, 4096), (300, 8192)];
    pair_bits(
        (&ef, &xs),
        (&[1, 2], &shapes),
        (false, " (input in shared memory)"),
        dev,
        t,
    )?;
    let shapes = [
        (1024, 2048),
        (1024, 3072),
        (2048, 2048),
        (2048, 6144),
        (1000, 4096),
    ];
    pair_bits(
        (&ef, &xs),
        (&[3, 5, 8], &shapes),
        (true, " (tensor-core input staged)"),
        dev,
        t,
    )
}

/// `b` against `a` bit for bit (tolerance 0) for each row count of `rows` and each `(n, k)` of
/// `shapes` (random inputs and weights): the plain matmul, SiLU*up when `silu`, and behind the
/// fused norm (output and residual sum), each check's name ending in `tag`.
fn pair_bits(
    (a, b): (&CudaKernels, &CudaKernels),
    (rows, shapes): (&[usize], &[(usize, usize)]),
    (silu, tag): (bool, &str),
    dev: &Device,
    t: &mut Table,
) -> Res<()> {
    let dt = DType::BF16;
    let zeros = |r: usize, c: usize| Tensor::zeros((r, c), dt, dev);
    for &rows in rows {
        for &(n, kk) in shapes {
            let x = randn(&[rows, kk], dt, dev)?;
            let w = (randn(&[n, kk], dt, dev)? * 0.05)?.to_dtype(dt)?;
            let (o1, o2) = (zeros(rows, n)?, zeros(rows, n)?);
            a.linear_into(&x, &w, &o1)?;
            b.linear_into(&x, &w, &o2)?;
            t.check(
                format!("gemv rows {rows} n {n} k {kk}{tag}"),
                max_diff(&o1, &o2)?,
                0.0,
            );
            if silu {
                let name = format!("gemv_silu rows {rows} n {n} k {kk}{tag}");
                silu_bits((a, b), (&x, &w), name, dev, t)?;
            }
            let names = [
                format!("norm_gemv rows {rows} n {n} k {kk}{tag}"),
                format!("norm_gemv rows {rows} k {kk} residual sum{tag}"),
            ];
            norm_bits((a, b), &w, (rows, false), names, dev, t)?;
        }
    }
    Ok(())
}

/// The streamed 1-row matmul (`LaunchOptions::gemv_tma`, sm_90) against the skinny matmuls
/// (`gemv_tma` None), bit for bit (tolerance 0), at 1, 3, 4 and 10 pieces a warp, over shapes
/// where a warp takes several rows, one or none (7 rows), 0.6B's down and o among them (of any
/// row count here: the engine gives it only 1,024-row weights). On a GPU without sm_90 both are
/// the skinny matmuls.
fn tma_bits(dev: &Device, t: &mut Table) -> Res<()> {
    let dt = DType::BF16;
    let skinny = LaunchOptions {
        gemv_tma: None,
        ..LaunchOptions::default()
    };
    let def = CudaKernels::new(dev, dt, &skinny)?.ok_or("no kernels")?;
    for ns in [1u8, 3, 4, 10] {
        let opts = LaunchOptions {
            gemv_tma: Some(ns),
            gemv_tma_any_rows: true,
            ..LaunchOptions::default()
        };
        let k = CudaKernels::new(dev, dt, &opts)?.ok_or("no kernels")?;
        for &(n, kk) in &[
            (1024usize, 3072usize),
            (512, 3072),
            (1000, 4096),
            (1024, 4096),
            (7, 4096),
            (1024, 2048),
            (999, 2048),
        ] {
            let x = randn(&[1, kk], dt, dev)?;
            let w = (randn(&[n, kk], dt, dev)? * 0.05)?.to_dtype(dt)?;
            let (o1, o2) = (
                Tensor::zeros((1, n), dt, dev)?,
                Tensor::zeros((1, n), dt, dev)?,
            );
            def.linear_into(&x, &w, &o1)?;
            k.linear_into(&x, &w, &o2)?;
            let name = format!("gemv_tma {ns} pieces a warp, n {n} k {kk} (bits of gemv.cu)");
            t.check(name, max_diff(&o1, &o2)?, 0.0);
        }
    }
    Ok(())
}

/// `LaunchOptions::gemv_mma_plain` (here weights of up to 4Mi elements) takes the tensor-core
/// kernels for the plain and SiLU matmuls of 3-8 rows on such weights and leaves the rest to
/// cuBLAS: bit for bit the `gemv_mma` set's outputs there (the same kernels), the cuBLAS
/// set's on a 6Mi-element weight; behind a norm, the separate norm then the same matmul (a
/// dispatch that took the wrong kernel for a kind or a size fails it, as the two paths round
/// differently).
fn mma_plain_dispatch(dev: &Device, t: &mut Table) -> Res<()> {
    let set = |o: LaunchOptions| -> Res<CudaKernels> {
        Ok(CudaKernels::new(dev, DType::BF16, &o)?.ok_or("no kernels")?)
    };
    let d = LaunchOptions {
        gemv_mma_plain: None,
        ..LaunchOptions::default()
    };
    let (def, mma) = (
        set(d)?,
        set(LaunchOptions {
            gemv_mma: true,
            ..d
        })?,
    );
    let k = set(LaunchOptions {
        gemv_mma_plain: Some(4 << 20),
        ..d
    })?;
    let dt = DType::BF16;
    let zeros = |r: usize, c: usize| Tensor::zeros((r, c), dt, dev);
    for rows in [3usize, 8] {
        for &(n, kk) in &[(1024usize, 2048usize), (2048, 1024), (2048, 3072)] {
            let tc = n * kk <= 4 << 20;
            let same = if tc { &mma } else { &def };
            let x = randn(&[rows, kk], dt, dev)?;
            let w = (randn(&[n, kk], dt, dev)? * 0.05)?.to_dtype(dt)?;
            let (o1, o2) = (zeros(rows, n)?, zeros(rows, n)?);
            same.linear_into(&x, &w, &o1)?;
            k.linear_into(&x, &w, &o2)?;
            let path = if tc { "tensor cores" } else { "cuBLAS" };
            let name = format!("gemv_mma_plain rows {rows} n {n} k {kk} = {path}");
            t.check(name, max_diff(&o1, &o2)?, 0.0);
            let name = format!(
                "gemv_mma_plain silu rows {rows} I {} k {kk} = {path}",
                n / 2
            );
            silu_bits((same, &k), (&x, &w), name, dev, t)?;
            let names = [
                format!("gemv_mma_plain norm rows {rows} n {n} k {kk} = norm + {path}"),
                format!("gemv_mma_plain norm rows {rows} k {kk} residual sum"),
            ];
            if tc {
                // Behind a norm: the separate norm, then the tensor-core kernel.
                norm_apart_bits((&def, &mma, &k), &w, rows, &names[0], dev, t)?;
            } else {
                norm_bits((&def, &k), &w, (rows, false), names, dev, t)?;
            }
        }
    }
    Ok(())
}

/// `k`'s fused-norm matmul (`norm_linear_into`) against the default set's add+RMSNorm
/// (`def`) followed by the plain matmul of `mma`: the same bits.
fn norm_apart_bits(
    (def, mma, k): (&CudaKernels, &CudaKernels, &CudaKernels),
    w: &Tensor,
    rows: usize,
    name: &str,
    dev: &Device,
    t: &mut Table,
) -> Res<()> {
    let dt = DType::BF16;
    let kk = w.dim(1)?;
    let zeros = |r: usize, c: usize| Tensor::zeros((r, c), dt, dev);
    let (res, delta) = (randn(&[rows, kk], dt, dev)?, randn(&[rows, kk], dt, dev)?);
    let nw = randn(&[kk], dt, dev)?.affine(0.1, 1.0)?.to_dtype(dt)?;
    let n = w.dim(0)?;
    let (h1, r1, o1) = (zeros(rows, kk)?, zeros(rows, kk)?, zeros(rows, n)?);
    def.add_rmsnorm_to(Some(&delta), &res, &r1, &nw, 1e-6, &h1)?;
    mma.linear_into(&h1, w, &o1)?;
    let (h2, r2, o2) = (zeros(rows, kk)?, zeros(rows, kk)?, zeros(rows, n)?);
    k.norm_linear_into(
        (&res, Some(&delta), &r2),
        (&nw, 1e-6),
        &h2,
        w,
        &o2,
        None,
        None,
    )?;
    t.check(name.to_string(), max_diff(&o1, &o2)?, 0.0);
    t.check(format!("{name} (residual sum)"), max_diff(&r1, &r2)?, 0.0);
    Ok(())
}

/// The plain kernel with two warps a row (`LaunchOptions::gemv_split_k`) against f32 math on
/// the same bf16 inputs, 1-2 rows over 2,064 to 10,240 inputs (a second batch of one chunk
/// for some lanes, half a batch, two, five), with a ragged row count.
fn split_rows(dev: &Device, t: &mut Table) -> Res<()> {
    let opts = LaunchOptions {
        gemv_split_k: true,
        gemv_tma: None,
        ..LaunchOptions::default()
    };
    let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("no kernels")?;
    let dt = DType::BF16;
    for rows in 1..=2usize {
        for &(n, kk) in &[
            (1000usize, 2064usize),
            (1024, 3072),
            (2047, 6144),
            (512, 10240),
        ] {
            let x = randn(&[rows, kk], dt, dev)?;
            let w = (randn(&[n, kk], dt, dev)? * 0.05)?.to_dtype(dt)?;
            let out = Tensor::zeros((rows, n), dt, dev)?;
            k.linear_into(&x, &w, &out)?;
            let f = |x: &Tensor| x.to_dtype(DType::F32);
            let reference = f(&x)?.matmul(&f(&w)?.t()?)?;
            let name = format!("gemv rows {rows} n {n} k {kk} (two warps a row)");
            t.check(name, rel(&out, &reference)?, 2e-2);
        }
    }
    Ok(())
}

/// The double-buffered plain and norm kernels (`LaunchOptions::gemv_double_buffer`) against
/// the default ones, bit for bit, on 1-2 rows over more than 2,048 inputs: a second batch
/// of one chunk for some lanes only (2,056), of half a batch (3,072), of a whole one (4,096),
/// a third of one chunk for some lanes (4,104), three whole ones (6,144) and five (10,240).
fn double_bits(plain: &CudaKernels, k: &CudaKernels, dev: &Device, t: &mut Table) -> Res<()> {
    let shapes = [
        (1000, 2056),
        (1024, 3072),
        (2048, 6144),
        (1000, 4096),
        (1000, 4104),
        (512, 10240),
    ];
    let tag = " (two batches in flight)";
    pair_bits((plain, k), (&[1, 2], &shapes), (false, tag), dev, t)
}

/// The streamed-rows gate|up kernels (`LaunchOptions::gemv_stream`) against the default ones,
/// bit for bit (tolerance 0), on 1-2 rows: SiLU*up alone and behind the fused norm (with the
/// residual sum), over shapes where a warp takes one row pair, several, or none, with rows of
/// fewer chunks than a lane's batch of loads and of more.
fn stream_bits(
    plain: &CudaKernels,
    k: &CudaKernels,
    tag: &str,
    dev: &Device,
    t: &mut Table,
) -> Res<()> {
    let dt = DType::BF16;
    for rows in 1..=2usize {
        for &(n, kk) in &[
            (4096usize, 1024usize),
            (1024, 2048),
            (1000, 96),
            (2048, 6144),
            (12288, 2048),
            (6144, 1024),
            (5002, 2048),
            (3002, 1024),
        ] {
            let x = randn(&[rows, kk], dt, dev)?;
            let w = (randn(&[n, kk], dt, dev)? * 0.05)?.to_dtype(dt)?;
            let i = n / 2;
            let name = format!("gemv_silu rows {rows} I {i} k {kk}{tag}");
            silu_bits((plain, k), (&x, &w), name, dev, t)?;
            let names = [
                format!("norm_gemv_silu rows {rows} I {i} k {kk}{tag}"),
                format!("norm_gemv_silu rows {rows} k {kk} residual sum{tag}"),
            ];
            norm_bits((plain, k), &w, (rows, true), names, dev, t)?;
        }
    }
    Ok(())
}

/// The gate|up SiLU product of `x` and `w` by `a` and by `b`, checked bit for bit as `name`.
fn silu_bits(
    (a, b): (&CudaKernels, &CudaKernels),
    (x, w): (&Tensor, &Tensor),
    name: String,
    dev: &Device,
    t: &mut Table,
) -> Res<()> {
    let dt = DType::BF16;
    let (rows, n) = (x.dim(0)?, w.dim(0)?);
    let zeros = |c: usize| Tensor::zeros((rows, c), dt, dev);
    let (a1, a2, gu) = (zeros(n / 2)?, zeros(n / 2)?, zeros(n)?);
    a.gate_up_silu_into(x, w, &gu, &a1)?;
    b.gate_up_silu_into(x, w, &gu, &a2)?;
    t.check(name, max_diff(&a1, &a2)?, 0.0);
    Ok(())
}

/// The largest |a - b| (0: bit for bit, up to the sign of zeros).
fn max_diff(a: &Tensor, b: &Tensor) -> Res<f32> {
    let (a, b) = (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?);
    Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

/// `w` behind the fused norm (SiLU*up with `silu`) on `rows` random residual rows, delta and
/// norm weight, run by `plain` and by `k`: output and residual sum checked bit for bit as
/// `names`.
fn norm_bits(
    (plain, k): (&CudaKernels, &CudaKernels),
    w: &Tensor,
    (rows, silu): (usize, bool),
    names: [String; 2],
    dev: &Device,
    t: &mut Table,
) -> Res<()> {
    let dt = DType::BF16;
    let (n, kk) = w.dims2()?;
    let zeros = |r: usize, c: usize| Tensor::zeros((r, c), dt, dev);
    let res = randn(&[rows, kk], dt, dev)?;
    let delta = randn(&[rows, kk], dt, dev)?;
    let nw = randn(&[kk], dt, dev)?.affine(0.1, 1.0)?.to_dtype(dt)?;
    let (h, gu) = (zeros(rows, kk)?, zeros(rows, n)?);
    let mut outs = Vec::new();
    for kern in [plain, k] {
        let res_out = zeros(rows, kk)?;
        let (out, act) = (zeros(rows, n)?, zeros(rows, n / 2)?);
        let r = (&res, Some(&delta), &res_out);
        let s = silu.then_some((&gu, &act));
        kern.norm_linear_into(r, (&nw, 1e-6), &h, w, &out, s, None)?;
        outs.push((if silu { act } else { out }, res_out));
    }
    let [out_name, sum_name] = names;
    t.check(out_name, max_diff(&outs[0].0, &outs[1].0)?, 0.0);
    t.check(sum_name, max_diff(&outs[0].1, &outs[1].1)?, 0.0);
    Ok(())
}

fn check_with(k: &CudaKernels, tag: &str, dev: &Device, t: &mut Table) -> Res<()> {
    let dt = DType::BF16;
    let f = |x: &Tensor| x.to_dtype(DType::F32);
    let matmul = |x: &Tensor, w: &Tensor| -> Res<Tensor> { Ok(f(x)?.matmul(&f(w)?.t()?)?) };
    let next = randn(&[1000, 1024], dt, dev)?;
    for rows in 1..=8usize {
        for &(n, kk) in &[
            (4096usize, 1024usize),
            (1024, 2048),
            (1000, 96),
            (2048, 6144),
            (1024, 3072),
        ] {
            let x = randn(&[rows, kk], dt, dev)?;
            let w = (randn(&[n, kk], dt, dev)? * 0.05)?.to_dtype(dt)?;
            let out = Tensor::zeros((rows, n), dt, dev)?;
            k.linear_next_into(&x, &w, &out, Some(&next))?;
            t.check(
                format!("gemv rows {rows} n {n} k {kk}{tag}"),
                rel(&out, &matmul(&x, &w)?)?,
                2e-2,
            );
            // gate|up with SiLU*up: w is [2I, K] with I = n / 2.
            let i = n / 2;
            let act = Tensor::zeros((rows, i), dt, dev)?;
            let gu = Tensor::zeros((rows, n), dt, dev)?;
            k.gate_up_silu_into(&x, &w, &gu, &act)?;
            let full = matmul(&x, &w)?;
            let reference =
                (candle_nn::ops::silu(&full.narrow(1, 0, i)?)? * full.narrow(1, i, i)?)?;
            t.check(
                format!("gemv_silu rows {rows} I {i} k {kk}{tag}"),
                rel(&act, &reference)?,
                2e-2,
            );
            if kk > 4096 {
                continue;
            }
            // Behind the fused norm: h = rmsnorm(bf16(res + delta)) * nw, then the matmul.
            let res = randn(&[rows, kk], dt, dev)?;
            let delta = randn(&[rows, kk], dt, dev)?;
            let nw = randn(&[kk], dt, dev)?.affine(0.1, 1.0)?.to_dtype(dt)?;
            let h = Tensor::zeros((rows, kk), dt, dev)?;
            let sum = (&res + &delta)?;
            let normed = candle_nn::ops::rms_norm(&f(&sum)?, &f(&nw)?, 1e-6)?.to_dtype(dt)?;
            for silu in [false, true] {
                // Fresh each run: a kernel that skipped the write would fail the sum check.
                let res_out = Tensor::zeros((rows, kk), dt, dev)?;
                let dst = if silu { &act } else { &out };
                k.norm_linear_into(
                    (&res, Some(&delta), &res_out),
                    (&nw, 1e-6),
                    &h,
                    &w,
                    &out,
                    silu.then_some((&gu, &act)),
                    Some(&next),
                )?;
                let full = matmul(&normed, &w)?;
                let reference = if silu {
                    (candle_nn::ops::silu(&full.narrow(1, 0, i)?)? * full.narrow(1, i, i)?)?
                } else {
                    full
                };
                t.check(
                    format!(
                        "norm_gemv{} rows {rows} n {n} k {kk}{tag}",
                        if silu { "_silu" } else { "" }
                    ),
                    rel(dst, &reference)?,
                    2e-2,
                );
                t.check(
                    format!("norm_gemv rows {rows} k {kk} (residual sum){tag}"),
                    rel(&res_out, &sum)?,
                    1e-2,
                );
            }
        }
    }
    Ok(())
}
