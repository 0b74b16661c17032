//! Capturing the decode graphs: one per bucket and variant, each after one eager run of the
//! same launches (`super::DecodeGraphs`).

use std::time::Instant;

use candle_core::cuda_backend::cudarc::driver::{CudaGraph, sys};

use super::super::buckets::bucket_for;
use super::super::graph_rows::{Variant, padding};
use super::{DecodeGraphs, OnRank, mem_info};
use crate::engine::cuda::{CudaKernels, kernel_err};
use crate::engine::model::Model;
use crate::engine::model::attention::{AttnGroup, AttnPlan};
use crate::engine::model::kernel_forward::{KernelForward, skip};
use crate::engine::model::kv_cache::PagedKvCache;
use crate::engine::parallel::comm::CommBackend;
use crate::error::Result;

impl DecodeGraphs {
    /// Captures one graph per bucket over `cache` (after one eager run of the same launches,
    /// which loads what cuBLAS loads lazily). With `comm` (tensor parallelism) every rank
    /// calls this at once: the eager runs' all-reduces meet, and the graphs hold theirs.
    pub fn capture(
        &mut self,
        model: &Model,
        cache: &PagedKvCache,
        graph_pdl: bool,
        comm: Option<&dyn CommBackend>,
    ) -> Result<()> {
        let k = model
            .kernels
            .as_ref()
            .ok_or_else(|| kernel_err("graph", "the model runs without kernels"))?;
        let start = Instant::now();
        let (free_before, _) = mem_info()?;
        // Programmatic dependent launch inside the graphs too (the matmuls prefetch their
        // weights while the kernel before them runs), unless `graph_pdl` is off
        // (`KernelOptions::graph_pdl`).
        let fwd = KernelForward {
            model: &model.qwen3,
            kernels: k,
        };
        self.fused = self.buckets.iter().map(|&b| fwd.fuses_decode(b)).collect();
        let pdl = k.set_pdl(false);
        k.set_pdl(pdl && graph_pdl);
        let captured = self.capture_all(model, k, cache, comm);
        k.set_pdl(pdl);
        let (graphs, lora_graphs, verify_graphs, (short_graphs, long_graphs)) = captured?;
        self.stream
            .synchronize()
            .map_err(|e| kernel_err("graph capture", e))?;
        let (free_after, _) = mem_info()?;
        self.graphs = graphs;
        self.lora_graphs = lora_graphs;
        self.verify_graphs = verify_graphs;
        self.short_graphs = short_graphs;
        self.long_graphs = long_graphs;
        self.bytes += free_before.saturating_sub(free_after);
        self.capture_secs = start.elapsed().as_secs_f64();
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    fn capture_all(
        &self,
        model: &Model,
        k: &CudaKernels,
        cache: &PagedKvCache,
        comm: Option<&dyn CommBackend>,
    ) -> Result<(
        Vec<CudaGraph>,
        Vec<CudaGraph>,
        Vec<Option<CudaGraph>>,
        (Vec<Option<CudaGraph>>, Vec<Option<CudaGraph>>),
    )> {
        let one =
            |b: usize, variant: Variant| self.capture_one((model, k, cache, comm), b, variant);
        let mut graphs = Vec::with_capacity(self.buckets.len());
        let mut lora_graphs = Vec::new();
        let mut verify_graphs = Vec::new();
        for &b in &self.buckets {
            graphs.push(one(b, Variant::Decode)?);
        }
        if self.lora_at.is_some() {
            for &b in &self.buckets {
                lora_graphs.push(one(b, Variant::Lora)?);
            }
        }
        let verified = match self.verify_rows {
            0 => 0,
            rows => bucket_for(&self.buckets, rows).map_or(self.buckets.len(), |i| i + 1),
        };
        // Every verify size with the shared-K/V verify attention, else fused buckets alone.
        for (&b, &fused) in self.buckets[..verified].iter().zip(&self.fused) {
            verify_graphs.push(if fused || k.shares_verify_kv() {
                Some(one(b, Variant::Verify)?)
            } else {
                None
            });
        }
        // The fused buckets once more where `takes` (bucket, partitions) says so.
        let fused_again = |variant: Variant, takes: &dyn Fn(usize, usize) -> bool| {
            let each = self.buckets.iter().zip(&self.fused).zip(&self.splits);
            each.map(|((&b, &fused), &splits)| match fused && takes(b, splits) {
                true => one(b, variant).map(Some),
                false => Ok(None),
            })
            .collect::<Result<Vec<_>>>()
        };
        let fwd = KernelForward {
            model: &model.qwen3,
            kernels: k,
        };
        // On the tensor-core kernels (a context of one token fits any cluster), and with
        // `fused_long_ctx` (`fused_long_ctx_one` for one row, `_many` for 5+) unfused.
        let short_graphs = fused_again(Variant::Short, &|b, s| fwd.short_context(b, s, 1))?;
        let long_graphs = fused_again(Variant::Long, &|b, _| k.fused_long_context(b, usize::MAX))?;
        Ok((
            graphs,
            lora_graphs,
            verify_graphs,
            (short_graphs, long_graphs),
        ))
    }

    /// One bucket's graph (after one eager run of its launches).
    fn capture_one(&self, on: OnRank<'_>, b: usize, variant: Variant) -> Result<CudaGraph> {
        // (The warm-up run and the capture write the input ids, with `graph_feed`.)
        self.fed.set(None);
        self.upload(b, &vec![padding(); b], 1, false)?;
        if variant == Variant::Lora {
            self.upload_lora(&vec![0; 3 * b])?;
        }
        self.run_bucket(on, b, variant)?;
        self.stream
            .synchronize()
            .map_err(|e| kernel_err("graph warm-up", e))?;
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| kernel_err("graph capture", e))?;
        let ran = self.run_bucket(on, b, variant);
        // Capture ends whatever happened, so the stream is usable again.
        let ended = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| kernel_err("graph capture", e));
        ran?;
        let graph = ended?.ok_or_else(|| kernel_err("graph capture", "empty graph"))?;
        graph.upload().map_err(|e| kernel_err("graph upload", e))?;
        Ok(graph)
    }

    /// The launches a bucket's graph holds: the layers (with the LoRA deltas when `lora`),
    /// the final norm, lm_head and the f32 logits (rank 0), on the static buffers.
    fn run_bucket(&self, on: OnRank<'_>, b: usize, variant: Variant) -> Result<()> {
        let (model, k, cache, comm) = on;
        let mut inputs = self.inputs(b)?;
        if variant == Variant::Lora
            && let Some(at) = self.lora_at
        {
            inputs.lora = Some(self.input.narrow(0, at, 3 * b)?);
        }
        inputs.verify = variant == Variant::Verify;
        inputs.short_ctx = variant == Variant::Short;
        inputs.long_ctx = variant == Variant::Long;
        let shared = inputs.verify && k.shares_verify_kv();
        inputs.runs = inputs.runs.take().filter(|_| shared);
        let acts = self.acts.rows(b)?;
        let plan = AttnPlan {
            groups: vec![AttnGroup::KernelDecode { n: b, first: 0 }],
        };
        KernelForward {
            model: &model.qwen3,
            kernels: k,
        }
        .layers_into(&inputs, &acts, &plan, cache, comm, None)?;
        if inputs.skip & skip::HEAD != 0 || model.qwen3.shard().rank != 0 {
            return Ok(());
        }
        let w = model.qwen3.lm_head.weight();
        let logits_act = self.logits_act.narrow(0, 0, b)?;
        let logits = self.logits.narrow(0, 0, b)?;
        let Some((ids, scratch)) = &self.greedy else {
            k.linear_into(&acts.h, w, &logits_act)?;
            return k.to_f32_into(&logits_act, &logits);
        };
        // With `graph_feed` the input ids get the tokens too: the next pipelined step's
        // (`DecodeGraphs::replay_fed`).
        let feed = k
            .graph_feed()
            .then(|| self.input.narrow(0, 0, b))
            .transpose()?;
        let ids = (&ids.narrow(0, 0, b)?, feed.as_ref());
        // One launch where the streamed lm_head takes the argmax too (`gemv_tma_head_argmax`,
        // 1 row).
        if k.lm_head_argmax_into(&acts.h, w, &logits, ids, scratch)? {
            return Ok(());
        }
        k.linear_into(&acts.h, w, &logits_act)?;
        k.to_f32_argmax_into(&logits_act, &logits, ids, scratch)
    }
}
