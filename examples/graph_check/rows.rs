//! `--rows-check`: whether a cuBLAS matmul of the model's shapes gives a row the same bits at
//! M rows (an eager step) as inside the M' rows of the graph bucket that replays it (padding
//! rows computed too). A graph and an eager step can only agree token for token if every op's
//! row results are independent of the step's row count.

use candle_core::{DType, Device, Tensor};
use policy_serve::engine::cuda::{CudaKernels, LaunchOptions};
use policy_serve::engine::{ModelConfig, graph_buckets};

use super::Res;

/// Both ways: cuBLAS's own choice for each row count (`--no-blas-row-class`; only reported),
/// and the row class's algorithm (the default; a row that differs fails the check).
pub(super) fn rows_check(cfg: &ModelConfig, dev: &Device, fails: &mut u32) -> Res<()> {
    for class in [false, true] {
        let opts = LaunchOptions {
            blas_row_class: class,
            ..LaunchOptions::default()
        };
        let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("kernels")?;
        println!(
            "\n{}",
            if class {
                "row class algorithms (default):"
            } else {
                "cuBLAS's own choice:"
            }
        );
        one_way(&k, cfg, dev, if class { Some(&mut *fails) } else { None })?;
    }
    Ok(())
}

fn one_way(k: &CudaKernels, cfg: &ModelConfig, dev: &Device, fails: Option<&mut u32>) -> Res<()> {
    let mut failed = false;
    let (h, hd) = (cfg.hidden_size, cfg.head_dim());
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let mut shapes = vec![
        ("qkv", (nh + 2 * nkv) * hd, h),
        ("o", h, nh * hd),
        ("lm_head", cfg.vocab_size, h),
    ];
    if cfg.num_experts > 0 {
        shapes.push(("router", cfg.num_experts, h));
    } else {
        shapes.push(("gate_up", 2 * cfg.intermediate_size, h));
        shapes.push(("down", h, cfg.intermediate_size));
    }
    let buckets = graph_buckets(256, 256);
    println!("| matmul | N x K | row counts M whose rows differ inside the bucket (of 3..=256) |");
    println!("|---|---|---|");
    for (name, n, kk) in shapes {
        let w = (Tensor::randn(0f32, 0.02, (n, kk), dev)?).to_dtype(DType::BF16)?;
        let x = (Tensor::randn(0f32, 1.0, (256, kk), dev)?).to_dtype(DType::BF16)?;
        let mut bad = Vec::new();
        for m in 3..=256usize {
            let Some(&b) = buckets.iter().find(|&&b| b >= m) else {
                continue;
            };
            if b == m {
                continue;
            }
            let (om, ob) = (
                Tensor::zeros((m, n), DType::BF16, dev)?,
                Tensor::zeros((b, n), DType::BF16, dev)?,
            );
            k.linear_into(&x.narrow(0, 0, m)?, &w, &om)?;
            k.linear_into(&x.narrow(0, 0, b)?, &w, &ob)?;
            let d = (om.to_dtype(DType::F32)? - ob.narrow(0, 0, m)?.to_dtype(DType::F32)?)?;
            if d.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()? != 0.0 {
                bad.push(m);
            }
        }
        failed |= !bad.is_empty();
        println!(
            "| {name} | {n} x {kk} | {} of {} differ: {:?} |",
            bad.len(),
            254,
            &bad[..bad.len().min(24)]
        );
    }
    if let Some(f) = fails {
        *f += u32::from(failed);
    }
    Ok(())
}
