//! [`ModelRunner::load`]: one model made ready to run steps: check the options, load this
//! rank's shard, allocate the CUDA graphs' buffers (before the KV cache is sized, so its
//! budget counts them), size and allocate the KV cache, say hello to the tensor-parallel
//! workers, capture the graphs.
//!
//! Invariant: nothing is allocated from a size the options give before that size is checked
//! against the device or host (an absurd flag is an error naming it, never an abort).

use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::{DType, Device};

use super::model_runner::ModelRunner;
use super::worker::rank_settings;
use crate::engine::model::config::ModelConfig;
use crate::engine::model::kv_cache::PagedKvCache;
use crate::engine::model::loader::{layer_progress, load_shard, served_context};
use crate::engine::model::shard::Shard;
use crate::engine::model::weights::Checkpoint;

/// The most rows of `a` (`max_loras` x rank padded to 8) the wide LoRA layout is set up for
/// (`KernelOptions::lora_wide`): twice the 8 x 16 it was measured at (BENCHMARKS.md, #23).
const LORA_WIDE_MAX_SLOT_ROWS: usize = 256;
use crate::engine::options::EngineOptions;
use crate::engine::parallel::comm::WorkerCommand;
use crate::error::{Error, Result};

/// How long the head waits for its workers to load and say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(900);

/// A runner ready to run steps, and what its load decided.
pub struct Loaded {
    pub(crate) runner: ModelRunner,
    /// Compute dtype.
    pub dtype: DType,
    /// The KV cache's storage dtype (the compute dtype, or `F8E4M3`).
    pub kv_dtype: DType,
    /// KV blocks allocated.
    pub num_blocks: usize,
    /// Bytes of one KV block on this rank.
    pub block_bytes: usize,
    /// The longest context served.
    pub max_context: usize,
    /// Whether the forward runs the engine's own kernels.
    pub kernels: bool,
    /// The batch sizes whose decode steps replay as CUDA graphs.
    pub cuda_graph_buckets: Vec<usize>,
    /// Ranks of the model (1: no tensor parallelism).
    pub world: usize,
    /// Most sequences decoding at once (the options' or derived, see `max_running_why`).
    pub max_running: usize,
    /// Why `max_running` is what it is (the start-up line says it).
    pub max_running_why: String,
    /// The weights' content digest (as stored in the files).
    pub digest: String,
    /// The draft model of speculative decoding (`SpeculativeMethod::Draft`).
    pub(crate) draft: Option<super::draft::DraftRunner>,
}

/// Checks the options that size allocations, before anything is allocated.
fn check_options(opts: &EngineOptions) -> Result<()> {
    let positive = [
        ("--block-size (block_size)", opts.block_size),
        ("--max-running (max_running)", opts.max_running.unwrap_or(1)),
        ("--max-graph-batch (max_graph_batch)", opts.max_graph_batch),
        (
            "--max-batched-tokens (max_batched_tokens)",
            opts.max_batched_tokens,
        ),
        ("--prefill-chunk (prefill_chunk)", opts.prefill_chunk),
    ];
    for (name, v) in positive {
        if v == 0 {
            return Err(Error::InvalidInput(format!("{name} must be positive")));
        }
    }
    if opts.block_size > 4096 {
        return Err(Error::InvalidInput(format!(
            "--block-size (block_size) {} is over 4096 tokens per block",
            opts.block_size
        )));
    }
    let gib = [
        ("--kv-cache-gib", opts.kv_budget.gpu_gib.unwrap_or(0.0)),
        ("--kv-cache-gib", opts.kv_budget.cpu_gib),
        ("--kv-host-gib", opts.kv_host_gib),
        (
            "--kv-disk-gib",
            opts.kv_disk.as_ref().map_or(0.0, |d| d.gib),
        ),
        ("--gpu-memory-utilization", opts.kv_budget.gpu_fraction),
    ];
    for (name, v) in gib {
        if !v.is_finite() || v < 0.0 {
            return Err(Error::InvalidInput(format!(
                "{name} must be a finite number >= 0, not {v}"
            )));
        }
    }
    if let Some(o) = opts.speculative {
        if !(1..=16).contains(&o.num_tokens) {
            return Err(Error::InvalidInput(format!(
                "--num-speculative-tokens (speculative.num_tokens) must be 1..=16, not {}",
                o.num_tokens
            )));
        }
        if let crate::engine::options::SpeculativeMethod::Ngram { min, max } = o.method
            && (min == 0 || min > max)
        {
            return Err(Error::InvalidInput(format!(
                "--speculative-ngram (speculative.method) MIN,MAX must have 1 <= MIN <= MAX, not {min},{max}"
            )));
        }
    }
    Ok(())
}

/// An fp8 cache's scales: the checkpoint's, or calibrated (logged either way).
fn fp8_scales(
    key: &str,
    cfg: &ModelConfig,
    weights: &[PathBuf],
    model: &crate::engine::model::Model,
    block_size: usize,
    comm: Option<&dyn crate::engine::parallel::comm::CommBackend>,
) -> Result<Vec<crate::engine::kv_format::KvScale>> {
    let (scales, source) = match super::kv_scales::checkpoint_scales(key, cfg, weights)? {
        Some(s) => (s, "checkpoint k_scale/v_scale"),
        None => (
            super::kv_scales::calibrate(model, cfg, block_size, comm)?,
            "calibration (a fixed prompt of 512 tokens, amax / 448)",
        ),
    };
    let range = |f: fn(&crate::engine::kv_format::KvScale) -> f32| {
        scales
            .iter()
            .map(f)
            .fold((f32::MAX, 0f32), |(lo, hi), x| (lo.min(x), hi.max(x)))
    };
    let (k, v) = (range(|s| s.k), range(|s| s.v));
    tracing::info!(
        model = key,
        source,
        k_scale = format!("{:.3e}..{:.3e}", k.0, k.1),
        v_scale = format!("{:.3e}..{:.3e}", v.0, v.1),
        "fp8 (e4m3) KV cache scales, per layer"
    );
    Ok(scales)
}

impl ModelRunner {
    /// Loads model `key` (`cfg`, `weights`) on `device` as `opts` says and makes it ready to
    /// run steps (see the module docs).
    pub(crate) fn load(
        key: &str,
        cfg: &ModelConfig,
        weights: &[PathBuf],
        device: &Device,
        opts: &EngineOptions,
    ) -> Result<Loaded> {
        check_options(opts)?;
        let comm = opts
            .tensor_parallel
            .as_ref()
            .map(|c| c.0.clone())
            .filter(|c| c.world_size() > 1);
        let shard = match &comm {
            Some(c) if c.rank() != 0 => {
                return Err(Error::InvalidInput(format!(
                    "rank {} runs `run_worker`, not an engine; only rank 0 serves",
                    c.rank()
                )));
            }
            Some(c) => Shard::tensor(0, c.world_size()).with_expert_parallel(opts.expert_parallel),
            None => Shard::FULL.with_expert_parallel(opts.expert_parallel),
        };
        let pb = layer_progress(cfg.num_hidden_layers, key);
        let mut model = load_shard(
            key,
            cfg,
            weights,
            opts.dtype,
            device,
            shard,
            &opts.kernels,
            || pb.inc(1),
        )?;
        pb.finish_and_clear();
        if let Some(l) = &opts.lora {
            if cfg.is_moe() {
                return Err(Error::Unsupported(
                    "LoRA adapters on mixture-of-experts models are not served yet; serve the adapters of a dense Qwen3".into(),
                ));
            }
            if shard.world > 1 {
                return Err(Error::InvalidInput(format!(
                    "LoRA adapters are not served on tensor-parallel engines yet ({} ranks); serve the adapters' base on one GPU",
                    shard.world
                )));
            }
            if l.max_loras == 0
                || l.max_lora_rank == 0
                || l.max_loras > 256
                || l.max_lora_rank > 512
            {
                return Err(Error::InvalidInput(format!(
                    "--max-loras ({}) must be within 1..=256 and --max-lora-rank ({}) within 1..=512",
                    l.max_loras, l.max_lora_rank
                )));
            }
            let slots = crate::engine::model::lora_slots::LoraSlots::new(
                cfg,
                l.max_loras,
                l.max_lora_rank,
                model.dtype(),
                device,
            )?;
            tracing::info!(
                model = key,
                max_loras = l.max_loras,
                max_lora_rank = l.max_lora_rank,
                mib = slots.bytes() >> 20,
                "LoRA adapter slots reserved"
            );
            model.qwen3.lora = Some(slots);
            // The wide layout reads every slot's `a` in each matmul of the steps it serves:
            // set up where that is at most twice the measured 8 slots of rank 16.
            let slot_rows = l.max_loras * l.max_lora_rank.next_multiple_of(8);
            match opts.kernels.lora_wide {
                Some(min_rows) if slot_rows <= LORA_WIDE_MAX_SLOT_ROWS => {
                    model.widen_lora_slots()?;
                    tracing::info!(
                        model = key,
                        min_rows,
                        "LoRA slots stored after the base weights: steps of {min_rows}-64 rows shrink inside the base matmuls (KernelOptions::lora_wide)"
                    );
                }
                Some(_) => tracing::info!(
                    model = key,
                    slot_rows,
                    "LoRA shrinks in launches of their own: max_loras x rank above {LORA_WIDE_MAX_SLOT_ROWS} (KernelOptions::lora_wide)"
                ),
                None => {}
            }
        }
        let dtype = model.dtype();
        let kernels = model.uses_kernels();
        let max_context = served_context(cfg);
        let kv_dtype = super::kv_scales::kv_dtype(opts.kv_dtype, &model)?;
        let block_bytes =
            cfg.kv_bytes_per_token(kv_dtype.size_in_bytes()) * opts.block_size / shard.world;
        // `max_running` left to the engine follows the KV pool the budget gives before the
        // graphs take their share (they are small next to it).
        let (max_running, max_running_why) = match opts.max_running {
            Some(n) => (n, "given".to_string()),
            None => {
                let blocks = opts.kv_budget.blocks_for(device, block_bytes)?;
                crate::engine::defaults::max_running(
                    !device.is_cpu(),
                    blocks.saturating_mul(opts.block_size),
                )
            }
        };
        // Never more blocks than `max_running` full contexts use; checked, so an absurd
        // `max_running` cannot wrap into a small number.
        let max_useful = max_running.saturating_mul(max_context.div_ceil(opts.block_size));
        // The graphs' buffers come before the KV cache is sized, so its budget counts them.
        #[cfg(feature = "cuda")]
        let graphs = if opts.cuda_graphs && (comm.is_none() || opts.tp_graphs) {
            // Without room for the graphs' buffers the engine still serves, eagerly.
            // Verify steps of speculative decoding replay too: 1..=max_batch sequences,
            // each its last token and K drafts, every row count a bucket of its own (one
            // rank only: the workers capture decode buckets alone).
            let verify: Vec<usize> = match (opts.speculative, &comm) {
                (Some(o), None) => (1..=o.max_batch.min(opts.max_graph_batch))
                    .map(|m| m * (o.num_tokens + 1))
                    .collect(),
                _ => Vec::new(),
            };
            super::graphs::DecodeGraphs::allocate(
                &model,
                (max_running, opts.max_graph_batch),
                max_context,
                opts.block_size,
                &verify,
            )
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "no memory for CUDA graphs; decode steps run eagerly");
                None
            })
        } else {
            None
        };
        // A draft model's cache holds as many tokens as the target's, out of the same budget.
        let draft = match opts.speculative.map(|o| o.method) {
            Some(crate::engine::options::SpeculativeMethod::Draft) => {
                let dir = opts.speculative_model.as_ref().ok_or_else(|| {
                    Error::InvalidInput(
                        "--speculative-method draft needs --speculative-model DIR (speculative_model)".into(),
                    )
                })?;
                if shard.world > 1 {
                    return Err(Error::Unsupported(format!(
                        "a draft model is not served on tensor-parallel engines yet ({} ranks); use --speculative-method ngram",
                        shard.world
                    )));
                }
                let target_dir = weights
                    .first()
                    .and_then(|w| w.parent())
                    .unwrap_or(Path::new("."));
                let (files, dcfg) = super::draft::draft_files(dir, cfg, target_dir)?;
                // Its weights first: the KV budget below sizes what memory is left.
                let m = super::draft::DraftRunner::load_model(&files, &dcfg, device, opts)?;
                let bytes = dcfg.kv_bytes_per_token(m.dtype().size_in_bytes()) * opts.block_size;
                Some((files, dcfg, bytes, m))
            }
            _ => None,
        };
        let draft_bytes = draft.as_ref().map_or(0, |d| d.2);
        let num_blocks = opts
            .kv_budget
            .blocks_for(device, block_bytes + draft_bytes)?
            .min(max_useful);
        if num_blocks == 0 {
            return Err(Error::Load {
                key: key.into(),
                reason: format!(
                    "the KV budget holds no block of {block_bytes} bytes; raise the KV budget"
                ),
            });
        }
        let mut cache = PagedKvCache::new(
            cfg,
            model.local_kv_heads(),
            num_blocks,
            opts.block_size,
            kv_dtype,
            device,
        )?;

        let digest = Checkpoint::open(key, weights, dtype, device)?.digest()?;
        if let Some(c) = &comm {
            // Every worker allocates the same blocks up front; the block tables of each step
            // travel with its command, so the ranks agree on slots and cached prefixes.
            let hello = WorkerCommand::Hello(rank_settings(
                cfg,
                (dtype, kv_dtype),
                opts,
                num_blocks,
                digest.clone(),
            ));
            for (i, ack) in c
                .send_command(&hello, HELLO_TIMEOUT)?
                .into_iter()
                .enumerate()
            {
                ack.map_err(|e| {
                    Error::Engine(format!("worker rank {} refused to start: {e}", i + 1))
                })?;
            }
            tracing::info!(
                model = key,
                world = c.world_size(),
                "tensor-parallel workers ready"
            );
        }
        if kv_dtype == DType::F8E4M3 {
            // Under tensor parallelism the workers run the same calibration now (each its own
            // KV heads' scales); its collectives pair with this rank's.
            let scales = fp8_scales(key, cfg, weights, &model, opts.block_size, comm.as_deref())?;
            cache.set_scales(scales)?;
        }
        let draft = draft
            .map(|(files, dcfg, _, m)| {
                let sizes = (num_blocks, max_context);
                super::draft::DraftRunner::new(m, &dcfg, &files.dir, device, opts, sizes)
            })
            .transpose()?;
        let world = shard.world;
        #[allow(unused_mut)]
        let mut runner = ModelRunner::new(model, cache, comm, opts.worker_timeout);
        #[cfg(feature = "cuda")]
        let cuda_graph_buckets = runner.capture_graphs(
            graphs,
            opts.kernels.graph_pdl,
            (max_running, opts.max_graph_batch, max_context),
        );
        #[cfg(not(feature = "cuda"))]
        let cuda_graph_buckets = Vec::new();
        Ok(Loaded {
            runner,
            dtype,
            kv_dtype,
            num_blocks,
            block_bytes,
            max_context,
            kernels,
            cuda_graph_buckets,
            world,
            max_running,
            max_running_why,
            digest,
            draft,
        })
    }
}
