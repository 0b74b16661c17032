//! o's 1-row matmul on the entry that prefetches the gate|up's late rows into L2
//! (`LaunchOptions::o_prefetch_mlp`, `kernels/gemv.cu` `gemv_pfm_t1_bf16`).

use super::gemv::max_diff;
use super::*;

/// o's 1-row matmul on the entry that prefetches the gate|up's late rows into L2
/// (`LaunchOptions::o_prefetch_mlp`) against the plain kernels, bit for bit (a prefetch
/// changes no value; a kernel that read its arguments out of step fails it), and that it
/// launches where the gate|up has rows loaded after its wait (1.7B's, 1,024 MiB and 8 MiB of
/// them) and not where every row is loaded before (0.6B's) or o is not on the plain kernel.
pub(super) fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let dt = DType::BF16;
    let plain = CudaKernels::new(dev, dt, &LaunchOptions::default())?.ok_or("no kernels")?;
    for mib in [1024usize, 8] {
        let opts = LaunchOptions {
            o_prefetch_mlp: Some(mib),
            ..LaunchOptions::default()
        };
        let k = CudaKernels::new(dev, dt, &opts)?.ok_or("no kernels")?;
        // (o's n, k, the gate|up's pairs and inputs, whether it launches)
        for (n, kk, pairs, kg, launches) in [
            (2048usize, 2048usize, 6144usize, 2048usize, true),
            (1000, 1024, 6144, 2048, true),
            (2048, 2048, 3072, 1024, false),
            (1024, 2048, 6144, 2048, false),
            (2048, 6144, 6144, 2048, false),
        ] {
            let x = randn(&[1, kk], dt, dev)?;
            let w = (randn(&[n, kk], dt, dev)? * 0.05)?.to_dtype(dt)?;
            let gu = (randn(&[2 * pairs, kg], dt, dev)? * 0.05)?.to_dtype(dt)?;
            let (a, b) = (
                Tensor::zeros((1, n), dt, dev)?,
                Tensor::zeros((1, n), dt, dev)?,
            );
            plain.linear_into(&x, &w, &a)?;
            let ran = k.o_prefetch_mlp_into((&x, &w, &b), &gu)?;
            let what = format!("o n {n} k {kk}, gate|up {pairs} x {kg}, {mib} MiB");
            t.check(
                format!("o prefetching the gate|up: {what} launches ({launches}) ?"),
                if ran == launches { 0.0 } else { 1.0 },
                0.0,
            );
            if ran {
                t.check(
                    format!("o prefetching the gate|up: {what}"),
                    max_diff(&a, &b)?,
                    0.0,
                );
            }
        }
    }
    Ok(())
}
