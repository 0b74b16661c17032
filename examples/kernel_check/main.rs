//! On the GPU: every kernel of `kernels/` against a candle reference on random inputs of many
//! shapes (the fused decode attention against the unfused kernels, bit for bit), then the
//! whole model (kernels vs the candle path, same weights), then greedy tokens
//! of two engines (kernels vs candle path) over 64 steps for 8 ragged prompts. Prints a table
//! of max relative errors (max |ours - ref| / max |ref|) and exits non-zero on a failure.
//!
//!     cargo build --release --features cuda --example kernel_check
//!     .gpu/bench --write-model /tmp/m && .gpu/kernel_check --model-dir /tmp/m

mod fp8;
mod fused;
mod gemv;
mod greedy;
mod lora;
mod lora_runs;
mod mma;
mod model;
mod moe;
mod ops;
mod prefill;
mod presum;
mod verify;

use model::{greedy_check, model_checks};
use ops::op_checks;

use std::path::PathBuf;

use candle_core::{DType, Device, IndexOp, Tensor};
use clap::Parser;
use policy_serve::engine::batch::{LogitRows, SeqInput};
use policy_serve::engine::cuda::{CudaKernels, LaunchOptions};
use policy_serve::engine::kv_format::KvRef;
use policy_serve::engine::model::kv_cache::PagedKvCache;
use policy_serve::engine::model::loader::load_shard;
use policy_serve::engine::model::shard::Shard;
use policy_serve::engine::{
    DTypeChoice, DeviceChoice, Engine, KernelOptions, ModelConfig, select_device,
};
use policy_serve::testing::synthetic_prompt;
use policy_serve::{EngineOptions, GenerationRequest, ModelRegistry, ModelSpec};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Parser)]
struct Args {
    /// A model directory (written by `bench --write-model`) for the model-level checks.
    #[arg(long)]
    model_dir: PathBuf,
    /// Only trace: a file of comma-separated token ids whose per-layer states (bf16 kernel
    /// forward, one prefill) go to `--trace-out` as .npz (`scripts/hf_trace_check.py`).
    #[arg(long)]
    trace_ids: Option<PathBuf>,
    /// Where the trace goes.
    #[arg(long, default_value = "/tmp/trace.npz")]
    trace_out: PathBuf,
    /// Only the fp8 KV checks (kernels, then the engine over fp8 KV).
    #[arg(long)]
    fp8_only: bool,
    /// Only the tensor-core decode attention's checks and timings.
    #[arg(long)]
    mma_only: bool,
    /// Only the shared-K/V verify attention checks.
    #[arg(long)]
    verify_only: bool,
    /// Only the LoRA checks (kernels vs candle ops with adapters, graphs vs eager).
    #[arg(long)]
    lora_only: bool,
    /// Only the fused decode attention and the model-level checks (kernels vs candle ops, greedy
    /// tokens of two engines): for a mixture-of-experts model, which serves no LoRA adapters.
    #[arg(long)]
    model_only: bool,
    /// Only the skinny-matmul checks (every variant; the streamed rows against the default
    /// kernels bit for bit), then the model-level checks and greedy tokens (bf16).
    #[arg(long)]
    gemv_only: bool,
    /// The kernel switches of the model-level checks (`--gemv-mma`, `--l2-prefetch`, ...).
    #[command(flatten)]
    kernels: policy_serve::engine::KernelFlags,
}

struct Table {
    rows: Vec<(String, f32, f32)>,
}

impl Table {
    fn check(&mut self, name: String, err: f32, tol: f32) {
        let ok = err.is_finite() && err <= tol;
        println!(
            "{:<60} rel_err {err:>9.2e} (tol {tol:.0e}) {}",
            name,
            if ok { "ok" } else { "FAIL" }
        );
        self.rows.push((name, err, tol));
    }

    /// A check of a fact rather than a distance: `ok` passes, anything else fails (printed
    /// and counted as a check of error 0 or 1 at tolerance 0).
    fn holds(&mut self, name: String, ok: bool) {
        self.check(name, if ok { 0.0 } else { 1.0 }, 0.0);
    }
}

fn rel(a: &Tensor, b: &Tensor) -> Res<f32> {
    let a = a.to_dtype(DType::F32)?.flatten_all()?;
    let b = b.to_dtype(DType::F32)?.flatten_all()?;
    let d = (a - &b)?.abs()?.max(0)?.to_scalar::<f32>()?;
    let s = b.abs()?.max(0)?.to_scalar::<f32>()?;
    Ok(d / s.max(1e-6))
}

/// The default launch paths with the decode attention on CUDA cores, fused or not: the kernel
/// the fused decode and the fp8 kernels are held to bit for bit (the tensor-core one rounds q
/// and the probabilities; `mma.rs` checks it, `fused.rs` the fused tensor-core loop against it).
fn cores() -> LaunchOptions {
    LaunchOptions {
        mma_decode: false,
        fused_mma: None,
        ..LaunchOptions::default()
    }
}

/// The checked model (`--model-dir`) under `opts`: its registry (the caller keeps it while it
/// uses the engine) and its engine.
fn engine(a: &Args, opts: EngineOptions) -> Res<(ModelRegistry, Engine)> {
    let r = ModelRegistry::new(vec![ModelSpec::local("m", "m", &a.model_dir)])?.with_options(opts);
    let e = r.model("m")?.engine().clone();
    Ok((r, e))
}

/// Submits every request at once, then waits for each: their tokens, in order.
fn tokens_of(
    e: &Engine,
    requests: impl IntoIterator<Item = GenerationRequest>,
) -> Res<Vec<Vec<u32>>> {
    let pending: Vec<_> = requests.into_iter().map(|r| e.submit(r)).collect();
    Ok(pending
        .into_iter()
        .map(|p| p.wait().map(|g| g.tokens))
        .collect::<Result<_, _>>()?)
}

fn randn(shape: &[usize], dt: DType, dev: &Device) -> Res<Tensor> {
    Ok(Tensor::randn(0f32, 1.0, shape, dev)?.to_dtype(dt)?)
}

/// The load-time choice of the compute dtype `dt` (f32, else bf16).
fn dtype_choice(dt: DType) -> DTypeChoice {
    if dt == DType::F32 {
        DTypeChoice::F32
    } else {
        DTypeChoice::BF16
    }
}

fn tol(dt: DType) -> f32 {
    if dt == DType::F32 { 1e-4 } else { 2e-2 }
}

fn main() -> Res<()> {
    policy_serve::init_logging("warn");
    let a = Args::parse();
    let dev = select_device(DeviceChoice::Cuda(0))?;
    if let Some(ids) = &a.trace_ids {
        return model::trace(&a.model_dir, ids, &a.trace_out, &dev);
    }
    let mut t = Table { rows: Vec::new() };
    if a.model_only {
        // The fused decode attention too: MoE shapes (GQA group 8) run it.
        fused::checks(&dev, &mut t)?;
        moe::checks(&dev, &mut t)?;
        for dt in [DType::BF16, DType::F32] {
            model_checks(&a, &dev, dt, &mut t)?;
        }
        greedy_check(&a, &mut t)?;
        return report(t);
    }
    if a.gemv_only {
        let k =
            CudaKernels::new(&dev, DType::BF16, &LaunchOptions::default())?.ok_or("no kernels")?;
        ops::argmax_checks(&k, &dev, &mut t)?;
        greedy::checks(&dev, DType::BF16, &mut t)?;
        greedy::head_checks(&dev, &mut t)?;
        gemv::checks(&dev, &mut t)?;
        model_checks(&a, &dev, DType::BF16, &mut t)?;
        greedy_check(&a, &mut t)?;
        return report(t);
    }
    if a.mma_only {
        mma::checks(&dev, &mut t)?;
        mma::engine_check(&a, &mut t)?;
        mma::timings(&dev)?;
        return report(t);
    }
    if a.verify_only {
        verify::checks(&dev, &mut t)?;
        verify::timings(&dev)?;
        return report(t);
    }
    if a.lora_only {
        for dt in [DType::BF16, DType::F32] {
            lora::lora_model_checks(&a, &dev, dt, &mut t)?;
        }
        lora::lora_grouped_checks(&dev, &mut t)?;
        lora_runs::checks(&dev, &mut t)?;
        lora::lora_graph_check(&a, &mut t)?;
        return report(t);
    }
    if a.fp8_only {
        fp8::checks(&dev, &mut t)?;
        fp8::engine_check(&a, &mut t)?;
        return report(t);
    }
    fused::checks(&dev, &mut t)?;
    mma::checks(&dev, &mut t)?;
    verify::checks(&dev, &mut t)?;
    fp8::checks(&dev, &mut t)?;
    gemv::checks(&dev, &mut t)?;
    prefill::checks(&dev, &mut t)?;
    moe::checks(&dev, &mut t)?;
    prefill::timings(&dev)?;
    for dt in [DType::BF16, DType::F32] {
        op_checks(&dev, dt, &mut t)?;
        model_checks(&a, &dev, dt, &mut t)?;
        lora::lora_model_checks(&a, &dev, dt, &mut t)?;
    }
    greedy_check(&a, &mut t)?;
    fp8::engine_check(&a, &mut t)?;
    lora::lora_grouped_checks(&dev, &mut t)?;
    lora_runs::checks(&dev, &mut t)?;
    lora::lora_graph_check(&a, &mut t)?;
    report(t)
}

/// Prints the totals and the failed checks; an error when any failed.
fn report(t: Table) -> Res<()> {
    let failed: Vec<_> = t
        .rows
        .iter()
        .filter(|(_, e, tl)| !(e.is_finite() && e <= tl))
        .collect();
    println!(
        "kernel-check: {} checks, {} failed",
        t.rows.len(),
        failed.len()
    );
    for (n, e, tl) in &failed {
        println!("FAILED {n}: {e:.3e} > {tl:.0e}");
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err("kernel checks failed".into())
    }
}
