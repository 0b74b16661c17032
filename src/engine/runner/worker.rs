//! The rank worker loop: what ranks above 0 run instead of serving.
//!
//! A worker loads its shard, waits for the head's `Hello` (refusing to start when its own
//! settings differ, naming the flag to mirror), allocates every KV block up front (block `i`
//! on every rank is the head's block `i`), then runs one step per command. A command that was
//! received and failed is logged and the worker stays up (the head fails that step, and the
//! request alone after its per-sequence retry); an error in receiving (link gone) ends the loop;
//! then the device is synchronized and everything torn down.

use std::path::Path;
use std::sync::Arc;

use candle_core::DType;

use crate::engine::batch::{SeqCommand, SeqInput, check_blocks, check_seq};
use crate::engine::device;
use crate::engine::model::Model;
use crate::engine::model::config::ModelConfig;
use crate::engine::model::files::ModelFiles;
use crate::engine::model::kv_cache::PagedKvCache;
use crate::engine::model::loader::load_shard;
use crate::engine::model::shard::Shard;
use crate::engine::model::update::check_checkpoint;
use crate::engine::model::weights::Checkpoint;
use crate::engine::options::EngineOptions;
use crate::engine::parallel::comm::{
    CommBackend, CommHandle, InProcessComm, RankSettings, WorkerCommand, agree,
};
use crate::error::{Error, Result};

/// A hook that makes a worker fail chosen commands (fault-injection tests).
pub type FailHook = Arc<dyn Fn(&WorkerCommand) -> bool + Send + Sync>;

/// How a worker runs.
#[derive(Clone, Default)]
pub struct WorkerOptions {
    /// Device, dtype, block size: as on the head.
    pub engine: EngineOptions,
    /// Fault injection: commands for which this returns true fail on this worker.
    pub fail_command: Option<FailHook>,
}

impl std::fmt::Debug for WorkerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerOptions")
            .field("engine", &self.engine)
            .field("fail_command", &self.fail_command.is_some())
            .finish()
    }
}

/// What a worker did before its loop ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Forward commands received.
    pub commands: u64,
    /// Of those, the ones that failed (on this rank or another).
    pub failed: u64,
    /// Of those, the ones this rank replayed as a CUDA graph (`EngineOptions::tp_graphs`).
    pub replayed: u64,
    /// Whether the loop ended on a `Shutdown` (else: the link went away).
    pub clean_shutdown: bool,
}

/// Runs rank `comm.rank()` (> 0) of a tensor-parallel model until the head shuts it down or
/// the link goes away.
pub fn run_worker(
    files: &ModelFiles,
    options: &WorkerOptions,
    comm: Arc<dyn CommBackend>,
) -> Result<WorkerReport> {
    let (rank, world) = (comm.rank(), comm.world_size());
    if rank == 0 {
        return Err(Error::InvalidInput(
            "rank 0 is the head: it serves through an Engine, not run_worker".into(),
        ));
    }
    let opts = &options.engine;
    let device = device::select(opts.device, opts.kernels.event_tracking)?;
    let cfg = ModelConfig::from_file(&files.config)?;
    let key = format!("rank {rank}");
    let model = load_shard(
        &key,
        &cfg,
        &files.weights,
        opts.dtype,
        &device,
        Shard::tensor(rank, world).with_expert_parallel(opts.expert_parallel),
        &opts.kernels,
        || {},
    )?;
    let dtype = model.dtype();
    // The weights' digest before the handshake (the head compares it); an unreadable file is
    // the head's to hear about, in the ack.
    let digest = Checkpoint::open(&key, &files.weights, dtype, &device).and_then(|c| c.digest());
    tracing::info!(rank, world, "worker loaded its shard; waiting for the head");

    let head = match comm.recv_command()? {
        WorkerCommand::Hello(h) => h,
        other => {
            let msg = format!("expected Hello from the head, got {other:?}");
            let _ = comm.ack(Err(msg.clone()));
            return Err(Error::Engine(msg));
        }
    };
    let kv_dtype = match super::kv_scales::kv_dtype(opts.kv_dtype, &model) {
        Ok(d) => d,
        Err(e) => {
            let _ = comm.ack(Err(e.to_string()));
            return Err(e);
        }
    };
    let digest = match digest {
        Ok(d) => d,
        Err(e) => {
            let _ = comm.ack(Err(e.to_string()));
            return Err(e);
        }
    };
    let mine = rank_settings(&cfg, (dtype, kv_dtype), opts, head.num_blocks, digest);
    if let Err(e) = mine.check_against_head(&head) {
        let _ = comm.ack(Err(e.to_string()));
        tracing::error!(rank, error = %e, "refusing to start");
        return Err(e);
    }
    // Every block up front, in index order: block i here is the head's block i.
    let mut cache = PagedKvCache::new(
        &cfg,
        model.local_kv_heads(),
        head.num_blocks,
        head.block_size,
        kv_dtype,
        &device,
    )?;
    comm.ack(Ok(()))?;
    if kv_dtype == DType::F8E4M3 {
        // The head does the same now: from the checkpoint, or one calibration prefill run
        // together (its collectives pair with the head's); this rank's heads, its own scales.
        let scales = match super::kv_scales::checkpoint_scales(&key, &cfg, &files.weights)? {
            Some(s) => s,
            None => {
                super::kv_scales::calibrate(&model, &cfg, head.block_size, Some(comm.as_ref()))?
            }
        };
        cache.set_scales(scales)?;
    }

    let mut report = WorkerReport::default();
    #[cfg(feature = "cuda")]
    let mut graphs: Option<super::graphs::DecodeGraphs> = None;
    loop {
        let cmd = match comm.recv_command() {
            Ok(c) => c,
            Err(e) => {
                tracing::info!(rank, error = %e, "link to the head gone; worker loop ends");
                break;
            }
        };
        match &cmd {
            WorkerCommand::Shutdown => {
                let _ = comm.ack(Ok(()));
                report.clean_shutdown = true;
                break;
            }
            WorkerCommand::Hello(_) => {
                if comm.ack(Err("unexpected second Hello".into())).is_err() {
                    break;
                }
            }
            WorkerCommand::CheckWeights { dir } | WorkerCommand::UpdateWeights { dir } => {
                let write = matches!(cmd, WorkerCommand::UpdateWeights { .. });
                let status = weights_from_dir(&cfg, &model, dir, write)
                    .and_then(|()| Ok(device.synchronize()?))
                    .map_err(|e| e.to_string());
                if let Err(e) = &status {
                    tracing::warn!(rank, write, error = %e, "weight update refused on this worker; staying up");
                }
                if comm.ack(status).is_err() {
                    break;
                }
            }
            WorkerCommand::CaptureGraphs {
                max_running,
                max_graph_batch,
                max_context,
                graph_pdl,
            } => {
                #[cfg(feature = "cuda")]
                let allocated = super::graphs::DecodeGraphs::allocate(
                    &model,
                    (*max_running, *max_graph_batch),
                    *max_context,
                    head.block_size,
                    &[],
                )
                .and_then(|g| g.ok_or_else(|| Error::Engine("no CUDA kernels here".into())));
                #[cfg(not(feature = "cuda"))]
                let allocated: Result<()> = Err(Error::Unsupported(
                    "CUDA graphs need a build with the cuda feature".into(),
                ));
                #[cfg(not(feature = "cuda"))]
                let _ = (max_running, max_graph_batch, max_context, graph_pdl);
                let status = allocated.as_ref().map(|_| ()).map_err(|e| e.to_string());
                if let Err(e) = &status {
                    tracing::warn!(rank, error = %e, "cannot hold CUDA graphs; staying eager");
                }
                match ack_and_agree(comm.as_ref(), status, &device) {
                    Some(true) => {}
                    Some(false) => continue,
                    None => break,
                }
                #[cfg(feature = "cuda")]
                if let Ok(g) = allocated {
                    match capture_together(g, &model, &cache, *graph_pdl, comm.as_ref()) {
                        Ok(g) => graphs = g,
                        Err(e) => {
                            tracing::info!(rank, error = %e, "collective failed; worker loop ends");
                            break;
                        }
                    }
                }
            }
            WorkerCommand::Forward { step, tokens, seqs } => {
                report.commands += 1;
                let status = if options.fail_command.as_ref().is_some_and(|f| f(&cmd)) {
                    Err(format!("injected failure of step {step}"))
                } else {
                    check_seqs(seqs, &cache)
                };
                if let Err(e) = &status {
                    tracing::warn!(rank, step, error = %e, "command failed on this worker; staying up");
                }
                match ack_and_agree(comm.as_ref(), status, &device) {
                    Some(true) => {}
                    Some(false) => {
                        report.failed += 1;
                        continue;
                    }
                    None => break,
                }
                let inputs: Vec<SeqInput<'_>> = seqs.iter().map(SeqCommand::as_input).collect();
                // The head replays its graph for exactly the steps this rank replays its own.
                #[cfg(feature = "cuda")]
                let replayed = graphs
                    .as_ref()
                    .map_or(Ok(None), |g| g.replay(&model, tokens, &inputs));
                #[cfg(not(feature = "cuda"))]
                let replayed: Result<Option<()>> = Ok(None);
                let ran = match replayed {
                    Ok(Some(_)) => {
                        report.replayed += 1;
                        Ok(None)
                    }
                    Ok(None) => model.forward(tokens, &inputs, &cache, Some(comm.as_ref())),
                    Err(e) => Err(e),
                };
                if let Err(e) = ran {
                    report.failed += 1;
                    tracing::error!(rank, step, error = %e, "forward failed on this worker; staying up");
                }
            }
        }
    }
    device.synchronize()?;
    tracing::info!(rank, ?report, "worker stopped");
    Ok(report)
}

/// Acknowledges a command with this rank's `status`, then agrees with every rank on whether
/// all of them took it (before the command's first collective): `Some(all took it)`, or
/// `None` when the link or the collective is gone (the worker loop ends).
fn ack_and_agree(
    comm: &dyn CommBackend,
    status: std::result::Result<(), String>,
    device: &candle_core::Device,
) -> Option<bool> {
    let ok = status.is_ok();
    comm.ack(status).ok()?;
    agree(comm, ok, device)
        .inspect_err(|e| {
            tracing::info!(rank = comm.rank(), error = %e, "collective failed; worker loop ends")
        })
        .ok()
}

/// Captures `g` on this rank while every other rank captures its own (after all agreed that
/// each holds its buffers: `WorkerCommand::CaptureGraphs`), then agrees with them that every
/// capture succeeded. `Ok(None)`: one did not, and no rank keeps graphs (a step replayed on
/// one rank and run eagerly on another would not meet in its all-reduces).
#[cfg(feature = "cuda")]
pub(super) fn capture_together(
    mut g: super::graphs::DecodeGraphs,
    model: &Model,
    cache: &PagedKvCache,
    graph_pdl: bool,
    comm: &dyn CommBackend,
) -> Result<Option<super::graphs::DecodeGraphs>> {
    let captured = g.capture(model, cache, graph_pdl, Some(comm));
    if let Err(e) = &captured {
        tracing::warn!(rank = comm.rank(), error = %e, "CUDA graph capture failed on this rank");
    }
    Ok(agree(comm, captured.is_ok(), model.device())?.then_some(g))
}

/// Checks (and with `write`, writes into this rank's shard) the weights of checkpoint
/// directory `dir`, as the head does with its own.
fn weights_from_dir(cfg: &ModelConfig, model: &Model, dir: &Path, write: bool) -> Result<()> {
    let q = &model.qwen3;
    let files = crate::engine::model::files::safetensors_in(dir)?;
    let ck = Checkpoint::open("worker", &files, q.dtype(), q.device())?;
    let table = check_checkpoint(cfg, &ck, q.tied())?;
    if write {
        q.write_checkpoint(cfg, &ck, &table)?;
    }
    Ok(())
}

/// Checks a step's sequences against this rank's KV geometry before any collective.
fn check_seqs(seqs: &[SeqCommand], cache: &PagedKvCache) -> std::result::Result<(), String> {
    seqs.iter().try_for_each(|s| {
        check_seq(s.q_len, s.context_len, &s.block_table, cache.block_size())?;
        check_blocks(&s.block_table, cache.num_blocks())
    })
}

/// The settings every rank serving `cfg` (weights of `digest`) in `dtype` with `opts` over
/// `num_blocks` blocks must share (the head sends its own in `Hello`; a worker compares).
pub(crate) fn rank_settings(
    cfg: &ModelConfig,
    (dtype, kv_dtype): (DType, DType),
    opts: &EngineOptions,
    num_blocks: usize,
    digest: String,
) -> RankSettings {
    let model = format!(
        "{}:{}x{}",
        cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size
    );
    let speculative = match &opts.speculative {
        None => "off".to_string(),
        Some(s) => format!("{:?} x{}", s.method, s.num_tokens),
    };
    RankSettings::new(model, dtype, opts.block_size, num_blocks)
        .with_kv_cache(kv_dtype)
        .with_model_settings(opts.expert_parallel, speculative, digest)
}

/// Starts ranks `1..world` of a tensor-parallel model as threads of this process (the
/// in-process backend: CPU runs and tests) and returns the head's link for
/// [`EngineOptions::tensor_parallel`] plus the worker threads.
pub fn spawn_in_process_workers(
    files: &ModelFiles,
    world: usize,
    options: &EngineOptions,
) -> Result<(
    CommHandle,
    Vec<std::thread::JoinHandle<Result<WorkerReport>>>,
)> {
    if world < 2 {
        return Err(Error::InvalidInput(
            "an in-process tensor-parallel group needs world size >= 2".into(),
        ));
    }
    let mut comms: Vec<Arc<InProcessComm>> = InProcessComm::group(world, options.worker_timeout)
        .into_iter()
        .map(Arc::new)
        .collect();
    let head = comms.remove(0);
    let workers = comms
        .into_iter()
        .map(|c| {
            let files = files.clone();
            let o = WorkerOptions {
                engine: options.clone(),
                fail_command: None,
            };
            std::thread::Builder::new()
                .name(format!("policy-serve-rank-{}", c.rank()))
                .spawn(move || run_worker(&files, &o, c))
                .map_err(|e| Error::Engine(format!("cannot start a worker thread: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((CommHandle(head), workers))
}
