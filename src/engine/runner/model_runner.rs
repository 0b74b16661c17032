//! [`ModelRunner`]: runs steps. It owns the model, the KV tensors and the link to the
//! tensor-parallel workers; the scheduler hands it a batch and gets logits back, then the
//! ids drawn from them.
//!
//! Invariant (tensor parallel): each step's command goes to every worker first and all ranks
//! agree that every one of them took it before the first collective, so a worker that refuses a
//! step never leaves another rank waiting in a collective.

use std::sync::Arc;
use std::time::Duration;

use candle_core::Tensor;

use super::sampler::{self, RowDraw};
use crate::engine::batch::{SeqCommand, SeqInput};
use crate::engine::model::Model;
use crate::engine::model::kv_cache::PagedKvCache;
use crate::engine::parallel::comm::{CommBackend, WorkerCommand, agree};
use crate::error::{Error, Result};

/// A timing event on the device's stream (CUDA with the engine's kernels).
#[cfg(feature = "cuda")]
pub(crate) type GpuEvent = crate::engine::cuda::GpuEvent;

/// A timing event on the device's stream: none without CUDA.
#[cfg(not(feature = "cuda"))]
pub(crate) struct GpuEvent;

#[cfg(not(feature = "cuda"))]
impl GpuEvent {
    pub(crate) fn ms_since(&self, _earlier: &GpuEvent) -> f64 {
        0.0
    }
}

/// Token ids on their way to the host ([`ModelRunner::read_ids`]).
pub(crate) enum HostIds {
    /// Read already (the CPU, or the candle path).
    Ready(Vec<u32>),
    /// A copy queued behind the kernels that compute them.
    #[cfg(feature = "cuda")]
    Pending(crate::engine::cuda::PendingIds),
}

impl HostIds {
    /// The ids, once the work queued before them is done (not what was queued after).
    pub(crate) fn wait(self) -> Result<Vec<u32>> {
        match self {
            Self::Ready(ids) => Ok(ids),
            #[cfg(feature = "cuda")]
            Self::Pending(p) => p.wait(),
        }
    }
}

/// The model, its KV tensors and (on a tensor-parallel head) the link to the workers.
pub(crate) struct ModelRunner {
    pub(super) model: Model,
    cache: PagedKvCache,
    /// Decode steps replayed as CUDA graphs (captured by [`ModelRunner::capture_graphs`]).
    #[cfg(feature = "cuda")]
    graphs: Option<super::graphs::DecodeGraphs>,
    /// The greedy tokens the last graph replay computed with its logits
    /// (`KernelOptions::graph_argmax`): the logits' id and the tokens. Cleared by the next
    /// forward and by masks written into those logits, so a draw takes them only for the
    /// logits they were computed from, unedited.
    graph_greedy: super::graph_greedy::GraphGreedy,
    comm: Option<Arc<dyn CommBackend>>,
    worker_timeout: Duration,
    steps_sent: u64,
}

impl ModelRunner {
    pub(crate) fn new(
        model: Model,
        cache: PagedKvCache,
        comm: Option<Arc<dyn CommBackend>>,
        worker_timeout: Duration,
    ) -> Self {
        Self {
            model,
            cache,
            #[cfg(feature = "cuda")]
            graphs: None,
            graph_greedy: Default::default(),
            comm,
            worker_timeout,
            steps_sent: 0,
        }
    }

    /// Captures the decode graphs whose buffers `graphs` holds (allocated before the KV cache
    /// was sized). A capture that fails leaves the engine eager, with a warning. Returns the
    /// buckets captured. On a tensor-parallel head the workers capture theirs at once
    /// (`WorkerCommand::CaptureGraphs`, for `sizes`: max_running, max_graph_batch,
    /// max_context); if one rank cannot, every rank stays eager.
    #[cfg(feature = "cuda")]
    pub(crate) fn capture_graphs(
        &mut self,
        graphs: Option<super::graphs::DecodeGraphs>,
        graph_pdl: bool,
        sizes: (usize, usize, usize),
    ) -> Vec<usize> {
        let Some(mut g) = graphs else {
            return Vec::new();
        };
        let captured = match self.comm.clone() {
            None => g
                .capture(&self.model, &self.cache, graph_pdl, None)
                .map(|()| Some(g)),
            Some(c) => self.capture_with_workers(g, graph_pdl, sizes, c.as_ref()),
        };
        match captured {
            Ok(None) => {
                tracing::warn!("a worker could not capture CUDA graphs; decode steps run eagerly");
                Vec::new()
            }
            Ok(Some(g)) => {
                tracing::info!(
                    buckets = ?g.buckets(),
                    capture_ms = (g.capture_secs() * 1e3).round(),
                    graph_mib = g.bytes() >> 20,
                    "decode steps replay as CUDA graphs"
                );
                let b = g.buckets().to_vec();
                self.graphs = Some(g);
                b
            }
            Err(e) => {
                tracing::warn!(error = %e, "CUDA graph capture failed; decode steps run eagerly");
                Vec::new()
            }
        }
    }

    /// The head's side of [`WorkerCommand::CaptureGraphs`]: the workers allocate their
    /// graphs' buffers, every rank agrees that all did, then all capture together
    /// (`worker::capture_together`). `None`: a rank could not (none keeps graphs).
    #[cfg(feature = "cuda")]
    fn capture_with_workers(
        &self,
        g: super::graphs::DecodeGraphs,
        graph_pdl: bool,
        (max_running, max_graph_batch, max_context): (usize, usize, usize),
        comm: &dyn CommBackend,
    ) -> Result<Option<super::graphs::DecodeGraphs>> {
        let cmd = WorkerCommand::CaptureGraphs {
            max_running,
            max_graph_batch,
            max_context,
            graph_pdl,
        };
        let refused = self.command_all(comm, &cmd)?;
        if !refused.is_empty() {
            tracing::warn!(
                refused = refused.join("; "),
                "workers cannot hold CUDA graphs"
            );
            return Ok(None);
        }
        super::worker::capture_together(g, &self.model, &self.cache, graph_pdl, comm)
    }

    /// An event recorded on the stream now (the step profile's GPU clock); `None` without the
    /// CUDA kernels.
    pub(crate) fn gpu_event(&self) -> Option<GpuEvent> {
        #[cfg(feature = "cuda")]
        return self.model.kernels.as_ref().and_then(|k| k.event().ok());
        #[cfg(not(feature = "cuda"))]
        None
    }

    /// `logits` with each `(row, penalty, tokens)`'s repetition penalty applied
    /// (`sampler::penalize`).
    pub(crate) fn penalize(
        &self,
        logits: &Tensor,
        rows: &[(usize, f32, &[u32])],
    ) -> Result<Tensor> {
        sampler::penalize(&self.model, logits, rows)
    }

    /// `logits` masked by each `(row, mask)` of a grammar (`runner::mask`).
    pub(crate) fn mask_logits(
        &self,
        logits: &Tensor,
        masks: &[(usize, Vec<u32>)],
    ) -> Result<Tensor> {
        if !masks.is_empty() {
            // In place (a graph's logits too): the greedy tokens computed with them are stale.
            self.graph_greedy.forget();
        }
        super::mask::mask_logits(&self.model, logits, masks)
    }

    /// Starts the log-probs of `rows` (whole-vocabulary rows) of a step whose ids are not
    /// read yet (pipelined decode; see `runner::logprobs::launch`).
    pub(crate) fn launch_logprobs(
        &self,
        logits: &Tensor,
        ids: &Tensor,
        rows: &[super::logprobs::LogprobRow],
    ) -> Result<super::logprobs::Pending> {
        super::logprobs::launch(&self.model, logits, ids, rows)
    }

    /// Writes an adapter's image into LoRA slot `slot` (after the work queued so far).
    pub(crate) fn load_adapter(
        &self,
        slot: usize,
        adapter: &crate::engine::model::lora_slots::SlotImage,
    ) -> Result<()> {
        let slots = self
            .model
            .qwen3
            .lora
            .as_ref()
            .ok_or_else(|| Error::Engine("this engine reserved no LoRA slots".into()))?;
        slots.load(slot, adapter)
    }

    /// This rank's weights (weight updates write into them in place).
    pub(crate) fn qwen3(&self) -> &crate::engine::model::qwen3::Qwen3 {
        &self.model.qwen3
    }

    /// Waits until the device has finished the work queued so far (no-op on the CPU).
    pub(crate) fn synchronize(&self) -> Result<()> {
        Ok(self.model.qwen3.device().synchronize()?)
    }

    /// Whether the model spans several ranks.
    pub(crate) fn comm(&self) -> Option<&Arc<dyn CommBackend>> {
        self.comm.as_ref()
    }

    /// The next token of each row of f32 `logits` (`[rows, vocab]`), drawn as `draws` says
    /// (one per row), left where the logits are (u32 `[rows]`: nothing waits for them).
    /// Greedy rows and small top-k draws run on the device; other draws (no kernels, top_k
    /// absent or large) read the logits to the host.
    pub(crate) fn draw_ids(&self, logits: &Tensor, draws: &[RowDraw]) -> Result<Tensor> {
        // Every row greedy on a graph replay's own logits: the tokens computed with them.
        if let Some(ids) = self.graph_greedy.take_for(logits, draws) {
            return Ok(ids);
        }
        sampler::draw_ids(&self.model, logits, draws)
    }

    /// The log-probabilities of the ids drawn from `logits` for `rows` (`ids` on the device,
    /// `drawn` the same read to the host; see `runner::logprobs`).
    pub(crate) fn logprobs(
        &self,
        logits: &Tensor,
        (ids, drawn): (&Tensor, &[u32]),
        rows: &[super::logprobs::LogprobRow],
    ) -> Result<Vec<crate::engine::request::TokenLogprob>> {
        super::logprobs::logprobs(&self.model, logits, (ids, drawn), rows)
    }

    /// Every row of f32 `[R, n]` logits on the host, copying those rows alone
    /// (`sampler::host_rows`: a step's logits may be a view of a graph's static buffer).
    pub(crate) fn host_rows(&self, logits: &Tensor) -> Result<Vec<Vec<f32>>> {
        let rows: Vec<usize> = (0..logits.dim(0)?).collect();
        super::sampler::host_rows(&self.model, logits, &rows)
    }

    /// Starts reading u32 `ids` (`[n]`) to the host behind the work queued so far, without
    /// waiting for work queued later (the kernels' stream on CUDA; at once elsewhere).
    pub(crate) fn read_ids(&self, ids: &Tensor) -> Result<HostIds> {
        #[cfg(feature = "cuda")]
        if let Some(k) = &self.model.kernels {
            return Ok(HostIds::Pending(k.read_ids(ids)?));
        }
        Ok(HostIds::Ready(ids.to_vec1()?))
    }

    /// [`ModelRunner::forward`] with the token ids in a tensor (u32 `[tokens]`, e.g. the
    /// previous step's [`ModelRunner::draw_ids`]): a decode step replayed as a CUDA graph
    /// copies them into its inputs on the device, so nothing waits for the step that draws
    /// them; any other step reads them to the host first.
    pub(crate) fn forward_fed(
        &mut self,
        ids: &Tensor,
        inputs: &[SeqInput<'_>],
    ) -> Result<Option<Tensor>> {
        self.graph_greedy.forget();
        #[cfg(feature = "cuda")]
        if self.comm.is_none()
            && let Some(g) = &self.graphs
            && let Some(logits) = g.replay_fed(&self.model, ids, inputs)?
        {
            return self.replayed(logits);
        }
        let tokens: Vec<u32> = ids.to_vec1()?;
        self.forward(&tokens, inputs)
    }

    /// A graph replay's logits, its greedy tokens remembered where the graphs computed them
    /// (`KernelOptions::graph_argmax`).
    #[cfg(feature = "cuda")]
    fn replayed(&self, logits: Tensor) -> Result<Option<Tensor>> {
        let ids = match &self.graphs {
            Some(g) => g.greedy_ids(logits.dim(0)?)?,
            None => None,
        };
        self.graph_greedy.remember(&logits, ids);
        Ok(Some(logits))
    }

    /// What moves whole KV blocks to and from host memory (the tiers below the GPU): on
    /// CUDA pinned slots and asynchronous copies, elsewhere plain buffers.
    /// `reserve`: host bytes to pin ahead (the host tier's budget); `direct`: loads read the
    /// pinned slots from the scatter kernel (`KernelOptions::kv_load_direct`).
    pub(crate) fn kv_io(&self, reserve: usize, direct: bool) -> Box<dyn crate::cache::BlockIo> {
        let io = self.cache.io();
        #[cfg(not(feature = "cuda"))]
        let _ = (reserve, direct);
        #[cfg(feature = "cuda")]
        if self.model.qwen3.device().is_cuda() {
            let dev = self.model.qwen3.device().clone();
            match crate::engine::model::kv_pinned::PinnedKvIo::new(
                io.clone(),
                &dev,
                reserve,
                direct,
            ) {
                Ok(p) => return Box::new(p),
                Err(e) => {
                    tracing::warn!(error = %e, "pinned KV copies unavailable; moving blocks through pageable memory")
                }
            }
        }
        Box::new(io)
    }

    /// What the KV cache's block bytes mean (dtype; fp8 scales): part of the KV tiers' keys.
    pub(crate) fn kv_format_tag(&self) -> String {
        self.cache.format_tag()
    }

    /// Copies the KV of `blocks` to host memory (swap-out).
    pub(crate) fn swap_out(&self, blocks: &[u32]) -> Result<Vec<(Tensor, Tensor)>> {
        self.cache.read_blocks(blocks)
    }

    /// Writes KV read by [`ModelRunner::swap_out`] into `blocks` (swap-in).
    pub(crate) fn swap_in(&self, blocks: &[u32], data: &[(Tensor, Tensor)]) -> Result<()> {
        self.cache.write_blocks(blocks, data)
    }

    /// Sends `cmd` to every worker and agrees with all ranks on whether every one took it
    /// (before the command's first collective); returns the refusals (`rank i: reason`).
    fn command_all(&self, comm: &dyn CommBackend, cmd: &WorkerCommand) -> Result<Vec<String>> {
        let refused: Vec<String> = comm
            .send_command(cmd, self.worker_timeout)?
            .into_iter()
            .enumerate()
            .filter_map(|(i, a)| a.err().map(|e| format!("rank {}: {e}", i + 1)))
            .collect();
        agree(comm, refused.is_empty(), self.model.device())?;
        Ok(refused)
    }

    /// One forward over the model: on a tensor-parallel head, the command goes to every worker
    /// first and the ranks agree that all of them took it before the first collective.
    pub(crate) fn forward(
        &mut self,
        tokens: &[u32],
        inputs: &[SeqInput<'_>],
    ) -> Result<Option<Tensor>> {
        self.graph_greedy.forget();
        let Some(comm) = self.comm.clone() else {
            #[cfg(feature = "cuda")]
            if let Some(g) = &self.graphs
                && let Some(logits) = g.replay(&self.model, tokens, inputs)?
            {
                return self.replayed(logits);
            }
            return self.model.forward(tokens, inputs, &self.cache, None);
        };
        self.steps_sent += 1;
        let cmd = WorkerCommand::Forward {
            step: self.steps_sent,
            tokens: tokens.to_vec(),
            seqs: inputs.iter().map(SeqCommand::from_input).collect(),
        };
        let refused = self.command_all(comm.as_ref(), &cmd)?;
        if !refused.is_empty() {
            return Err(Error::Engine(format!(
                "a worker failed this step ({})",
                refused.join("; ")
            )));
        }
        // Every rank replays its graph for the same steps (the same buckets and the same
        // inputs give the same choice), so their all-reduces meet.
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.graphs
            && let Some(logits) = g.replay(&self.model, tokens, inputs)?
        {
            return self.replayed(logits);
        }
        self.model
            .forward(tokens, inputs, &self.cache, Some(comm.as_ref()))
    }
}
