//! `CommBackend`: how the ranks of one tensor-parallel model talk. The head (rank 0) sends
//! commands to the workers; all ranks meet in collectives (all-reduce, all-gather, barrier).
//!
//! Backends: [`InProcessComm`] (threads in one process; CPU tests and CPU runs) and, behind the
//! `nccl` feature, NCCL for tensors with a TCP link for commands (`super::nccl`).
//! Invariant: every rank calls the collectives in the same order with the same shapes; a
//! command that fails on a worker is caught before the first collective of its step (the
//! ranks agree on a status flag first), so a failure never leaves a rank waiting forever.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use candle_core::{Device, Tensor};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

use crate::engine::batch::SeqCommand;
use crate::error::{Error, Result};

/// What the head tells the workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerCommand {
    /// First message: the settings every rank must share.
    Hello(RankSettings),
    /// Run one forward step (prefill chunks and decode tokens) on these sequences.
    Forward {
        /// Step number (for logs).
        step: u64,
        /// Every sequence's new tokens, back to back.
        tokens: Vec<u32>,
        /// The sequences.
        seqs: Vec<SeqCommand>,
    },
    /// Check the weights in this directory against this rank's model (names, shapes,
    /// dtypes: headers only); write nothing.
    CheckWeights {
        /// A safetensors checkpoint directory every rank can read.
        dir: std::path::PathBuf,
    },
    /// Write the weights in this directory into this rank's shard, in place (after every
    /// rank checked them).
    UpdateWeights {
        /// The directory checked before.
        dir: std::path::PathBuf,
    },
    /// Allocate and capture this rank's decode graphs (`EngineOptions::tp_graphs`), the same
    /// buckets as the head's, in lockstep with it: ack when allocated, then every rank agrees,
    /// captures (the graphs hold the step's all-reduces) and agrees again; a rank that could
    /// not leaves every rank eager.
    CaptureGraphs {
        /// The head's `max_running` (the buckets reach the first that holds it).
        max_running: usize,
        /// The largest bucket (`--max-graph-batch`).
        max_graph_batch: usize,
        /// The longest context a graph serves (its block tables' width).
        max_context: usize,
        /// Programmatic dependent launch inside the graphs (`KernelOptions::graph_pdl`).
        graph_pdl: bool,
    },
    /// Stop serving: synchronize and tear down.
    Shutdown,
}

/// Settings that must be equal on every rank; a worker whose own differ refuses to start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankSettings {
    /// Tokens per KV block (`--block-size`).
    pub block_size: usize,
    /// KV blocks (decided by the head).
    pub num_blocks: usize,
    /// Compute dtype (`--dtype`).
    pub dtype: String,
    /// `model_type`, layers and hidden size of the checkpoint (same model on every rank).
    pub model: String,
    /// The KV cache's dtype (`--kv-cache-dtype`: `bf16`, `f32`, `f8e4m3`; empty: the
    /// compute dtype's). fp8 scales are each rank's own (its KV heads').
    #[serde(default)]
    pub kv_cache: String,
    /// How MoE experts are split (`experts sliced` or `expert-parallel`: `--expert-parallel`).
    #[serde(default)]
    pub parallel: String,
    /// Speculative decoding (`off`, or its method and draft length: `--speculative-method`).
    #[serde(default)]
    pub speculative: String,
    /// The weights' content digest (the same files on every rank).
    #[serde(default)]
    pub digest: String,
}

impl RankSettings {
    /// The settings of a rank serving `model` (its `model_type`, layers and hidden size, as
    /// `type:LxH`) in `dtype` over `num_blocks` blocks of `block_size` tokens.
    pub fn new(
        model: String,
        dtype: candle_core::DType,
        block_size: usize,
        num_blocks: usize,
    ) -> Self {
        Self {
            block_size,
            num_blocks,
            dtype: format!("{dtype:?}").to_lowercase(),
            model,
            kv_cache: String::new(),
            parallel: String::new(),
            speculative: String::new(),
            digest: String::new(),
        }
    }

    /// These settings with the expert split, the speculative settings and the weights'
    /// digest (see the fields).
    pub fn with_model_settings(
        mut self,
        expert_parallel: bool,
        speculative: String,
        digest: String,
    ) -> Self {
        self.parallel = if expert_parallel {
            "expert-parallel"
        } else {
            "experts sliced"
        }
        .into();
        self.speculative = speculative;
        self.digest = digest;
        self
    }

    /// These settings with the KV cache stored as `kv` (see [`RankSettings::kv_cache`]).
    pub fn with_kv_cache(mut self, kv: candle_core::DType) -> Self {
        self.kv_cache = format!("{kv:?}").to_lowercase();
        self
    }

    /// Checks a worker's own settings against the head's; the error names the flag to mirror.
    pub fn check_against_head(&self, head: &RankSettings) -> Result<()> {
        let flag = |name: &str, mine: &dyn std::fmt::Display, theirs: &dyn std::fmt::Display| {
            Err(Error::InvalidInput(format!(
                "this worker's {name} is {mine} but the head's is {theirs}; start the worker with {name} {theirs}"
            )))
        };
        if self.block_size != head.block_size {
            return flag("--block-size", &self.block_size, &head.block_size);
        }
        if self.dtype != head.dtype {
            return flag("--dtype", &self.dtype, &head.dtype);
        }
        if self.model != head.model {
            return flag("--model", &self.model, &head.model);
        }
        if self.parallel != head.parallel {
            let name = |s: &str| if s == "expert-parallel" { "on" } else { "off" };
            return Err(Error::InvalidInput(format!(
                "this worker's --expert-parallel is {} ({}) but the head's is {} ({}); start every rank with the same --expert-parallel",
                name(&self.parallel),
                self.parallel,
                name(&head.parallel),
                head.parallel
            )));
        }
        if self.speculative != head.speculative {
            return flag("--speculative-method", &self.speculative, &head.speculative);
        }
        if self.digest != head.digest {
            return Err(Error::InvalidInput(format!(
                "this worker's weights (digest {}) are not the head's (digest {}); give every rank the same checkpoint",
                self.digest, head.digest
            )));
        }
        if self.kv_cache != head.kv_cache {
            let name = |s: &str| if s == "f8e4m3" { "fp8" } else { "auto" }.to_string();
            return flag(
                "--kv-cache-dtype",
                &name(&self.kv_cache),
                &name(&head.kv_cache),
            );
        }
        Ok(())
    }
}

/// The link between the ranks of one model.
pub trait CommBackend: Send + Sync + std::fmt::Debug {
    /// This rank (0: the head).
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Head: sends a command to every worker and collects each worker's acknowledgement
    /// (`Err(reason)` when the worker could not take the command). Fails if a worker is gone
    /// or does not answer within `timeout`.
    fn send_command(
        &self,
        cmd: &WorkerCommand,
        timeout: Duration,
    ) -> Result<Vec<std::result::Result<(), String>>>;
    /// Worker: the next command; an error means the link is gone (the loop ends).
    fn recv_command(&self) -> Result<WorkerCommand>;
    /// Worker: acknowledges the last command (`Err(reason)`: it could not take it).
    fn ack(&self, status: std::result::Result<(), String>) -> Result<()>;
    /// Element-wise sum over all ranks; every rank gets the result.
    fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor>;
    /// [`CommBackend::all_reduce_sum`] written back into `t` (contiguous), allocating nothing
    /// where the backend can (NCCL: in place on the stream, so a CUDA graph can hold it).
    fn all_reduce_sum_in_place(&self, t: &Tensor) -> Result<()> {
        let sum = self.all_reduce_sum(t)?;
        Ok(t.slice_set(&sum, 0, 0)?)
    }
    /// Concatenation over all ranks along `dim`, in rank order.
    fn all_gather(&self, t: &Tensor, dim: usize) -> Result<Tensor>;
    /// Waits until every rank is here.
    fn barrier(&self) -> Result<()>;
}

/// A shared handle to a backend, usable in `EngineOptions::tensor_parallel`.
#[derive(Clone)]
pub struct CommHandle(pub Arc<dyn CommBackend>);

impl std::fmt::Debug for CommHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CommHandle(rank {} of {})",
            self.0.rank(),
            self.0.world_size()
        )
    }
}

impl PartialEq for CommHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The meeting point of one collective: each rank deposits, the last one in computes.
#[derive(Debug, Default)]
struct Meeting {
    generation: u64,
    deposits: Vec<Option<Tensor>>,
    result: Vec<Option<Tensor>>,
    arrived: usize,
    taken: usize,
    broken: bool,
}

#[derive(Debug)]
struct Shared {
    world: usize,
    meeting: Mutex<Meeting>,
    cv: Condvar,
    timeout: Duration,
}

/// In-process backend: one handle per rank, ranks are threads.
#[derive(Debug)]
pub struct InProcessComm {
    rank: usize,
    shared: Arc<Shared>,
    /// Head: one command link and one ack link per worker.
    to_workers: Mutex<Vec<(Sender<WorkerCommand>, Receiver<Ack>)>>,
    /// Worker: the command link from the head and the ack link back.
    from_head: Option<Mutex<(Receiver<WorkerCommand>, Sender<Ack>)>>,
}

type Ack = std::result::Result<(), String>;

impl InProcessComm {
    /// Handles for ranks `0..world`; collectives give up after `timeout` (a rank that died).
    pub fn group(world: usize, timeout: Duration) -> Vec<InProcessComm> {
        let shared = Arc::new(Shared {
            world,
            meeting: Mutex::new(Meeting {
                deposits: vec![None; world],
                result: vec![None; world],
                ..Default::default()
            }),
            cv: Condvar::new(),
            timeout,
        });
        let mut senders = Vec::new();
        let mut handles = Vec::new();
        for rank in 1..world {
            let (tx, rx) = channel();
            let (ack_tx, ack_rx) = channel();
            senders.push((tx, ack_rx));
            handles.push(InProcessComm {
                rank,
                shared: shared.clone(),
                to_workers: Mutex::new(vec![]),
                from_head: Some(Mutex::new((rx, ack_tx))),
            });
        }
        let head = InProcessComm {
            rank: 0,
            shared,
            to_workers: Mutex::new(senders),
            from_head: None,
        };
        std::iter::once(head).chain(handles).collect()
    }

    /// Head only: drops the command links (workers see the link gone and end their loops).
    pub fn close_links(&self) {
        self.to_workers.lock().clear();
    }

    /// Runs one collective: deposit `t`, wait for all, take this rank's share of `combine`.
    fn meet(
        &self,
        t: &Tensor,
        combine: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    ) -> Result<Tensor> {
        let sh = &self.shared;
        let dev = t.device().clone();
        let mut m = sh.meeting.lock();
        // Wait for the previous collective to be fully taken.
        while m.taken != 0 && !m.broken {
            if sh.cv.wait_for(&mut m, sh.timeout).timed_out() {
                m.broken = true;
            }
        }
        if m.broken {
            return Err(Error::Engine(
                "a collective was broken by a rank that did not arrive".into(),
            ));
        }
        let generation = m.generation;
        m.deposits[self.rank] = Some(t.to_device(&Device::Cpu)?);
        m.arrived += 1;
        if m.arrived == sh.world {
            let inputs: Vec<Tensor> = m
                .deposits
                .iter_mut()
                .map(|d| d.take().expect("every rank deposited"))
                .collect();
            let outs = combine(&inputs)?;
            m.result = outs.into_iter().map(Some).collect();
            m.arrived = 0;
            m.generation += 1;
            sh.cv.notify_all();
        } else {
            while m.generation == generation && !m.broken {
                if sh.cv.wait_for(&mut m, sh.timeout).timed_out() {
                    m.broken = true;
                    sh.cv.notify_all();
                    return Err(Error::Engine(format!(
                        "rank {}: a collective timed out after {:?}; a rank is gone",
                        self.rank, sh.timeout
                    )));
                }
            }
            if m.broken {
                return Err(Error::Engine(
                    "a collective was broken by a rank that did not arrive".into(),
                ));
            }
        }
        let out = m.result[self.rank].take().expect("result for this rank");
        m.taken += 1;
        if m.taken == sh.world {
            m.taken = 0;
            sh.cv.notify_all();
        }
        Ok(out.to_device(&dev)?)
    }
}

impl CommBackend for InProcessComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn send_command(&self, cmd: &WorkerCommand, timeout: Duration) -> Result<Vec<Ack>> {
        let links = self.to_workers.lock();
        if links.len() + 1 != self.shared.world {
            return Err(Error::Engine(
                "the command links to the workers are closed".into(),
            ));
        }
        for (i, (tx, _)) in links.iter().enumerate() {
            tx.send(cmd.clone()).map_err(|_| {
                Error::Engine(format!(
                    "worker rank {} is gone (its command link is closed)",
                    i + 1
                ))
            })?;
        }
        links
            .iter()
            .enumerate()
            .map(|(i, (_, acks))| {
                acks.recv_timeout(timeout).map_err(|e| {
                    Error::Engine(format!(
                        "worker rank {} did not acknowledge the command ({e}); it is gone or stuck",
                        i + 1
                    ))
                })
            })
            .collect()
    }

    fn recv_command(&self) -> Result<WorkerCommand> {
        let link = self
            .from_head
            .as_ref()
            .ok_or_else(|| Error::Engine("the head does not receive commands".into()))?;
        link.lock()
            .0
            .recv()
            .map_err(|_| Error::Engine("the link to the head is gone".into()))
    }

    fn ack(&self, status: Ack) -> Result<()> {
        let link = self
            .from_head
            .as_ref()
            .ok_or_else(|| Error::Engine("the head does not acknowledge".into()))?;
        link.lock()
            .1
            .send(status)
            .map_err(|_| Error::Engine("the link to the head is gone".into()))
    }

    fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor> {
        self.meet(t, |all| {
            let mut sum = all[0].clone();
            for x in &all[1..] {
                sum = (sum + x)?;
            }
            Ok(vec![sum; all.len()])
        })
    }

    fn all_gather(&self, t: &Tensor, dim: usize) -> Result<Tensor> {
        self.meet(t, |all| {
            let cat = Tensor::cat(all, dim)?;
            Ok(vec![cat; all.len()])
        })
    }

    fn barrier(&self) -> Result<()> {
        self.meet(
            &Tensor::zeros(1, candle_core::DType::F32, &Device::Cpu)?,
            |all| Ok(all.to_vec()),
        )
        .map(|_| ())
    }
}

/// All ranks agree whether every one of them can run the step: a failure anywhere makes all
/// skip it, so no rank waits in a collective for one that will not come.
pub fn agree(comm: &dyn CommBackend, ok: bool, device: &Device) -> Result<bool> {
    let flag = Tensor::new(&[if ok { 0f32 } else { 1f32 }], device)?;
    let total: Vec<f32> = comm
        .all_reduce_sum(&flag)?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1()?;
    Ok(total[0] == 0.0)
}
