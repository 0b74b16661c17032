//! The LoRA kernels of a decode step timed alone (`--profile`): each fused matmul's shrink
//! and expand with eight rank-16 adapters, every row on its own slot (one-token tiles, as the
//! bench's mixed batches), beside the base ops they go with.

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
        ..LaunchOptions::default()
    };
    let k = CudaKernels::new(dev, DType::BF16, &opts)?.ok_or("kernels")?;
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
    // One-token tiles (row i on slot i % 8, in the batch's order), and the rows grouped by slot
    // in tiles of up to 8 (`lora_grouped_tiles`).
    let mut one: Vec<u32> = (0..b as u32).flat_map(|i| [i, 1, i % 8]).collect();
    one.extend(0..b as u32);
    let order: Vec<u32> = (0..8u32)
        .flat_map(|s| (0..b as u32).filter(move |i| i % 8 == s))
        .collect();
    let mut grouped = Vec::new();
    let mut first = 0u32;
    for s in 0..8u32 {
        let n = order.iter().filter(|&&i| i % 8 == s).count() as u32;
        let mut done = 0;
        while done < n {
            let c = (n - done).min(8);
            grouped.extend([first + done, c, s]);
            done += c;
        }
        first += n;
    }
    grouped.extend(&order);
    let tiles1 = Tensor::new(one.as_slice(), dev)?;
    let tiles8 = Tensor::new(grouped.as_slice(), dev)?;
    let y = Tensor::zeros((b, 3 * r), DType::F32, dev)?;
    println!("\n## batch {b}: LoRA kernels alone (8 adapters, rank 16, row i on slot i % 8; us)");
    println!("| fused matmul | shrink | expand | grouped x8: shrink | expand | base matmul |");
    println!("|---|---|---|---|---|---|");
    let (mut total, mut total8) = (0.0, 0.0);
    for (name, fan_in, splits) in &groups {
        let parts = splits.len() - 1;
        let nout = *splits.last().ok_or("splits")?;
        let a = randn(&[slots, parts * r, *fan_in], dev)?;
        let bm = randn(&[slots, nout, r], dev)?;
        let w = randn(&[nout, *fan_in], dev)?;
        let x = randn(&[b, *fan_in], dev)?;
        let out = randn(&[b, nout], dev)?;
        let mut each = Vec::new();
        for (tiles, tile) in [(&tiles1, 1), (&tiles8, 8)] {
            let shrink = time_us(dev, || Ok(k.lora_shrink_into(&x, &a, (tiles, tile), &y)?))?;
            let expand = time_us(dev, || {
                Ok(k.lora_expand_into(&y, (&bm, splits), (tiles, tile), &out)?)
            })?;
            each.push((shrink, expand));
        }
        let base = time_us(dev, || Ok(k.linear_into(&x, &w, &out)?))?;
        let ((s1, e1), (s8, e8)) = (each[0], each[1]);
        total += s1 + e1;
        total8 += s8 + e8;
        println!("| {name} | {s1:.1} | {e1:.1} | {s8:.1} | {e8:.1} | {base:.1} |");
    }
    let gu = randn(&[b, 2 * inter], dev)?;
    let act = randn(&[b, inter], dev)?;
    let bgu = randn(&[slots, 2 * inter, r], dev)?;
    let silu = time_us(dev, || Ok(k.silu_mul_into(&gu, &act)?))?;
    let mut fused = Vec::new();
    for tiles in [&tiles1, &tiles8] {
        fused.push(time_us(dev, || {
            Ok(k.lora_expand_silu_into(&gu, (&y, &bgu), &act, tiles)?)
        })?);
    }
    println!(
        "| SiLU*up alone {silu:.1}; gate|up expand + SiLU in one launch | | {:.1} | | {:.1} | |",
        fused[0], fused[1]
    );
    println!("sum of the LoRA launches: {total:.1} us per layer (grouped x8: {total8:.1})");
    Ok(())
}
