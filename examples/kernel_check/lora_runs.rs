//! The run LoRA shrink (`LaunchOptions::lora_runs`, `kernels/lora_runs.cu`) against the
//! one-token shrink on random adapters: `y` within f32 rounding of theirs (the same products
//! summed in another order) and bit for bit the same whatever the table's order. Tables: a
//! slot per row sorted by slot, one slot for all rows, rows on 13 of 16 slots unsorted with
//! base rows, count-0 padding and a slot past those held, and the fewest rows it takes; ranks
//! 8, 16 and 64; the fan-ins of the 0.6B and 1.7B shapes (the 1.7B's down, 6,144, is left to
//! the one-token shrink: its `y` must then be theirs exactly).

use super::lora::{by_slot, flat_tiles, lora_shapes, normal, tile_cases};
use super::*;
use policy_serve::engine::cuda::{LORA_RUNS_MIN_ROWS, lora_scratch_cols};

pub(super) fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let kern = |runs: bool| -> Res<CudaKernels> {
        let o = LaunchOptions {
            lora_grouped: false,
            lora_runs: runs,
            ..LaunchOptions::default()
        };
        Ok(CudaKernels::new(dev, DType::BF16, &o)?.ok_or("kernels")?)
    };
    let (plain, runs) = (kern(false)?, kern(true)?);
    let normal = |shape: &[usize], s: f64| normal(shape, s, dev);
    let cases = tile_cases(("17 rows", LORA_RUNS_MIN_ROWS + 1));
    let shapes = lora_shapes();
    for (tname, rows, slots, table) in &cases {
        let tiles = flat_tiles(table, *rows, dev)?;
        t.check(
            format!("lora runs serve {tname} ?"),
            if runs.lora_runs_serve(*rows, 1) {
                0.0
            } else {
                1.0
            },
            0.0,
        );
        // The same tiles in row order (the shrink's sums must not depend on it).
        let mut in_rows = table.clone();
        in_rows.sort_by_key(|&(i, _)| i);
        let row_order = flat_tiles(&in_rows, *rows, dev)?;
        for r in [8usize, 16, 64] {
            for (sname, fan_in, splits) in &shapes {
                if r != 16 && !sname.starts_with("qkv") && !sname.starts_with("down 6") {
                    continue;
                }
                let parts = splits.len() - 1;
                let a = normal(&[*slots, parts * r, *fan_in], 0.05)?;
                let x = normal(&[*rows, *fan_in], 1.0)?;
                let cols = lora_scratch_cols(r, false);
                let zeros = || Tensor::zeros((*rows, cols), DType::F32, dev);
                let (y_ref, y, y_rows) = (zeros()?, zeros()?, zeros()?);
                plain.lora_shrink_into(&x, &a, (&tiles, 1), &y_ref)?;
                runs.lora_shrink_into(&x, &a, (&tiles, 1), &y)?;
                runs.lora_shrink_into(&x, &a, (&row_order, 1), &y_rows)?;
                // (Where the run shrink does not take the launch, the 1.7B's down, and o and down
                // below 64 rows, y is the one-token shrink's exactly.)
                let tol = 1e-5;
                t.check(
                    format!("lora runs shrink: {tname}, {sname}, r{r}"),
                    rel(&y, &y_ref)?,
                    tol,
                );
                t.check(
                    format!(
                        "lora runs shrink, table in row order = sorted: {tname}, {sname}, r{r}"
                    ),
                    rel(&y_rows, &y)?,
                    0.0,
                );
            }
        }
    }
    // Positive control: the delta through the run shrink changed the rows on adapters, and
    // left a base row.
    let n = 24;
    let x = normal(&[n, 1024], 1.0)?;
    let a = normal(&[8, 16, 1024], 0.05)?;
    let b = normal(&[8, 1024, 16], 0.05)?;
    let table: Vec<(u32, u32)> = by_slot(n).into_iter().filter(|&(i, _)| i != 5).collect();
    let tiles = flat_tiles(&table, n, dev)?;
    let y = Tensor::zeros((n, lora_scratch_cols(16, false)), DType::F32, dev)?;
    let out = normal(&[n, 1024], 1.0)?;
    let before = out.copy()?;
    runs.lora_into(&x, (&a, &b, &[0, 1024]), (&tiles, 1), &y, &out)?;
    let moved = rel(&out, &before)?;
    let base_row = rel(&out.narrow(0, 5, 1)?, &before.narrow(0, 5, 1)?)?;
    t.check(
        format!("lora runs: the delta moves the output (rel {moved:.3}), not a base row ?"),
        if moved > 1e-3 && base_row == 0.0 {
            0.0
        } else {
            1.0
        },
        0.0,
    );
    Ok(())
}
