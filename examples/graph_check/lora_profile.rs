//! The LoRA kernels of a decode step timed alone (`--profile`): each fused matmul's shrink
//! and expand with eight rank-16 adapters, every row on its own slot (one-token tiles, as the
//! bench's mixed batches), beside the base ops they go with; and the grouped kernels
//! (`LaunchOptions::lora_grouped`: the same tiles sorted by slot; steps of 33-64 rows) and the
//! run shrink (`LaunchOptions::lora_runs`: the sorted tiles by runs; steps of 17-64 rows).

use candle_core::{DType, Device, Tensor};
use policy_serve::engine::ModelConfig;
use policy_serve::engine::cuda::{CudaKernels, LaunchOptions};

use super::profile::time_us;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn randn(shape: &[usize], dev: &Device) -> Res<Tensor> {
    Ok((Tensor::randn(0f32, 0.5, shape, dev)? * 0.05)?.to_dtype(DType::BF16)?)
}

/// Prints the table for a batch of `b` rows.
pub fn rows(cfg: &ModelConfig, dev: &Device, b: usize) -> Res<()> {
    let opts = LaunchOptions {
        lora_overlap: true,
        lora_grouped: false,
        lora_runs: false,
        ..LaunchOptions::default()
    };
    let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("kernels")?;
    let grouped = LaunchOptions {
        lora_grouped: true,
        lora_runs: false,
        ..LaunchOptions::default()
    };
    let kg = CudaKernels::new(dev, DType::BF16, &grouped)?.ok_or("kernels")?;
    // Every projection's shrink and expand (the forward's rule takes some shrinks only).
    kg.set_lora_grouped_everywhere(true);
    let runs = LaunchOptions {
        lora_runs: true,
        lora_grouped: false,
        ..LaunchOptions::default()
    };
    let kr = CudaKernels::new(dev, DType::BF16, &runs)?.ok_or("kernels")?;
    let with_runs = kr.lora_runs_serve(b, 1);
    let (h, hd, inter) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let (slots, r) = (8usize, 16usize);
    let (q, kv) = (nh * hd, nkv * hd);
    // (name, input features, output splits) of the four fused matmuls.
    let groups: [(&str, usize, Vec<usize>); 4] = [
        ("qkv", h, vec![0, q, q + kv, q + 2 * kv]),
        ("o", q, vec![0, h]),
        ("gate|up", h, vec![0, inter, 2 * inter]),
        ("down", inter, vec![0, h]),
    ];
    let tiles: Vec<u32> = (0..b as u32).flat_map(|i| [i, 1, i % 8]).collect();
    let tiles = Tensor::from_vec(tiles, (b, 3), dev)?;
    // The same tiles in slot order, as the forward hands them to the grouped kernels.
    let mut rows: Vec<u32> = (0..b as u32).collect();
    rows.sort_by_key(|i| i % 8);
    let sorted: Vec<u32> = rows.iter().flat_map(|&i| [i, 1, i % 8]).collect();
    let sorted = Tensor::from_vec(sorted, (b, 3), dev)?;
    let cols = policy_serve::engine::cuda::lora_scratch_cols(r, true);
    let y = Tensor::zeros((b, cols), DType::F32, dev)?;
    println!(
        "\n## batch {b}: LoRA kernels alone (8 adapters, rank 16, a slot per row; us per launch)"
    );
    println!(
        "| fused matmul | shrink | expand | grouped shrink | grouped expand | runs shrink | base matmul (ours) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let (mut total, mut total_g, mut total_r) = (0.0, 0.0, 0.0);
    for (name, fan_in, splits) in &groups {
        let parts = splits.len() - 1;
        let nout = *splits.last().ok_or("splits")?;
        let a = randn(&[slots, parts * r, *fan_in], dev)?;
        let bm = randn(&[slots, nout, r], dev)?;
        let w = randn(&[nout, *fan_in], dev)?;
        let x = randn(&[b, *fan_in], dev)?;
        let out = randn(&[b, nout], dev)?;
        let shrink = time_us(dev, || Ok(k.lora_shrink_into(&x, &a, (&tiles, 1), &y)?))?;
        let expand = time_us(dev, || {
            Ok(k.lora_expand_into(&y, (&bm, splits), (&tiles, 1), &out)?)
        })?;
        let g_shrink = time_us(dev, || Ok(kg.lora_shrink_into(&x, &a, (&sorted, 1), &y)?))?;
        let g_expand = time_us(dev, || {
            Ok(kg.lora_expand_into(&y, (&bm, splits), (&sorted, 1), &out)?)
        })?;
        // The run kernels (none below their rows: the one-token kernels' figures again).
        let r_shrink = time_us(dev, || Ok(kr.lora_shrink_into(&x, &a, (&sorted, 1), &y)?))?;
        let base = time_us(dev, || Ok(k.linear_into(&x, &w, &out)?))?;
        total += shrink + expand;
        total_g += g_shrink + g_expand;
        total_r += r_shrink + expand;
        println!(
            "| {name} | {shrink:.1} | {expand:.1} | {g_shrink:.1} | {g_expand:.1} | {r_shrink:.1} | {base:.1} |"
        );
    }
    let gu = randn(&[b, 2 * inter], dev)?;
    let act = randn(&[b, inter], dev)?;
    let bgu = randn(&[slots, 2 * inter, r], dev)?;
    let silu = time_us(dev, || Ok(k.silu_mul_into(&gu, &act)?))?;
    let fused = time_us(dev, || {
        Ok(k.lora_expand_silu_into(&gu, (&y, &bgu), &act, &tiles)?)
    })?;
    println!("| SiLU*up alone / gate|up expand + SiLU in one launch | {silu:.1} | {fused:.1} | |");
    println!(
        "sum of the LoRA launches: {total:.1} us per layer (grouped: {total_g:.1}, run shrink{}: {total_r:.1}; SiLU apart)",
        if with_runs {
            ""
        } else {
            " (not served: one-token)"
        }
    );
    // The grouped shrink's split of the input features, swept (the rule: 1,024 a slice).
    if b > policy_serve::engine::cuda::LORA_GROUPED_MIN_ROWS {
        for (name, fan_in, splits) in &groups {
            let parts = splits.len() - 1;
            let a = randn(&[slots, parts * r, *fan_in], dev)?;
            let x = randn(&[b, *fan_in], dev)?;
            let mut line = format!("grouped shrink {name} by slices (us):");
            for s in [1usize, 2, 4, 8, 16] {
                kg.set_lora_grouped_slices(Some(s));
                let us = time_us(dev, || Ok(kg.lora_shrink_into(&x, &a, (&sorted, 1), &y)?))?;
                line += &format!(" {s}: {us:.1}");
            }
            kg.set_lora_grouped_slices(None);
            println!("{line}");
        }
    }
    Ok(())
}
