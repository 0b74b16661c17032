//! `--variant FLAGS` (repeated): kernel variants measured side by side in one process. Each
//! variant is a set of kernel flags (`KernelFlags`, as the CLI has them, e.g.
//! `--variant "" --variant "--attn-l2-prefetch 22"`; the empty string is the defaults). For
//! each of `--variant-rounds` rounds, every variant in turn gets an engine of its own on the
//! same model directory (the one before it dropped first, so each sizes its KV pool from the
//! same free memory), runs the decode rows of `--batches`, and is dropped. Rounds interleave
//! the variants (A B C, A B C), so drift over the run shows as a spread between a variant's
//! rounds rather than as a difference between variants.
//!
//! Against one bench process a variant, this pays the process's start, the CUDA context and
//! the candle-transformers logits check once instead of once a row: device time is what a
//! sweep is short of. Each row also says whether its greedy tokens equal the first variant's
//! of the same round and batch: every variant that only changes how a sum is scheduled must
//! give the same tokens (a prefetch is a hint; the reordered kernels are checked bit for bit
//! by `kernel_check`), so a variant that differs is named at once.

use std::path::Path;
use std::time::Instant;

use clap::Parser;
use policy_serve::EngineOptions;
use policy_serve::engine::{KernelFlags, KernelOptions};

use crate::rows::decode_round;
use crate::{Args, engine_on};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One `--variant`'s flags, parsed as the CLI parses its kernel flags.
#[derive(Parser, Debug)]
#[command(name = "--variant", no_binary_name = true)]
struct VariantFlags {
    #[command(flatten)]
    kernels: KernelFlags,
}

/// Each of `a`'s `--variant` strings as (label, options), all parsed before anything is
/// written or started: a typo in the last variant fails the run before the first one is
/// measured. Kernel flags outside the variants are refused, since a variant's flags replace
/// them.
pub(crate) fn parse_variants(a: &Args) -> Res<Vec<(String, KernelOptions)>> {
    if !a.variants.is_empty() && a.kernels != KernelFlags::default() {
        return Err(
            "--variant: put the kernel flags inside each --variant (a variant's flags replace \
             the command line's, so flags outside them would be silently dropped)"
                .into(),
        );
    }
    a.variants
        .iter()
        .map(|v| {
            let flags = VariantFlags::try_parse_from(v.split_whitespace()).map_err(|e| {
                let first = e.to_string();
                let first = first.lines().next().unwrap_or_default().to_string();
                format!("--variant {v:?}: {first}")
            })?;
            let label = if v.trim().is_empty() {
                "defaults".to_string()
            } else {
                v.split_whitespace().collect::<Vec<_>>().join(" ")
            };
            Ok((label, flags.kernels.options()))
        })
        .collect()
}

/// The sweep (see the module docs): one line a variant, round and batch,
/// `variant [LABEL] run R decode batch B: T tok/s (S ms/step; ...)`, and a line a variant and
/// round with its engine's set-up time.
pub(crate) fn variant_sweep(
    dir: &Path,
    opts: &EngineOptions,
    a: &Args,
    variants: &[(String, KernelOptions)],
) -> Res<()> {
    for round in 1..=a.variant_rounds.max(1) {
        // The first variant's tokens of this round, a batch at a time.
        let mut first: Vec<Vec<Vec<u32>>> = Vec::new();
        for (vi, (label, kernels)) in variants.iter().enumerate() {
            let t = Instant::now();
            let (registry, engine) = engine_on(
                dir,
                EngineOptions {
                    kernels: *kernels,
                    ..opts.clone()
                },
            )?;
            println!(
                "variant [{label}] run {round} setup {:.1} s",
                t.elapsed().as_secs_f64()
            );
            for (bi, &b) in a.batches.iter().enumerate() {
                let before = engine.stats();
                let r = decode_round(&engine, a, b, &|_, _| {})?;
                let after = engine.stats();
                let tokens: Vec<Vec<u32>> = r.gens.into_iter().map(|g| g.tokens).collect();
                let same = if vi == 0 {
                    first.push(tokens);
                    "first".to_string()
                } else {
                    let equal = tokens
                        .iter()
                        .zip(&first[bi])
                        .filter(|(x, y)| x == y)
                        .count();
                    format!("{equal}/{b} as the first")
                };
                println!(
                    "variant [{label}] run {round} decode batch {b}: {:.0} tok/s ({:.3} ms/step; prefill of batch {:.0} ms; tokens {same}; steps {}, pipelined {})",
                    r.tps,
                    r.decode_s * 1e3 / (a.new_tokens - 1) as f64,
                    r.first_s * 1e3,
                    after.steps - before.steps,
                    after.pipelined_steps - before.pipelined_steps
                );
            }
            drop(engine);
            drop(registry);
        }
    }
    Ok(())
}
