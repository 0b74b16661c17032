//! Weight updates on the scheduler thread: an update waits until nothing that started on the
//! old weights is left (drain), or ends those requests (`drain: false`), then writes the new
//! tensors into the model in place, drops the prefix cache and bumps the version.
//!
//! Invariants: a request runs start to finish on one version (the one its `Generation`
//! reports); new requests wait while an update is pending (nobody is refused); new weights
//! are checked when the update is asked, so a refused update writes nothing, pauses nothing
//! and ends no request.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use super::core::Scheduler;
use super::seq::{CheckedWeights, PendingUpdate, Seq};
use crate::engine::handle::Replier;
use crate::engine::model::config::ModelConfig;
use crate::engine::model::update::{check_checkpoint, check_tensor};
use crate::engine::model::weights::Checkpoint;
use crate::engine::parallel::comm::WorkerCommand;
use crate::engine::request::FinishReason;
use crate::engine::update::{WeightSource, WeightsVersion, content_digest};
use crate::error::{Error, Result};

/// Whether a sequence has started on the current weights (admitted once: running, or
/// preempted back to the queue).
fn started(s: &Seq) -> bool {
    s.admitted.is_some()
}

/// Any error of an update as [`Error::WeightUpdate`] (a file, checkpoint or device error
/// while checking or writing new weights is the update's, never the model's load).
fn as_update_error(e: Error) -> Error {
    match e {
        Error::WeightUpdate(_) => e,
        other => Error::WeightUpdate(other.to_string()),
    }
}

impl Scheduler {
    /// Takes an update request: checks the new weights at once (a refusal answers without
    /// pausing anything or ending a request), then pauses admission until it is applied. A
    /// second update while one is pending is refused.
    pub(super) fn ask_update(
        &mut self,
        source: WeightSource,
        drain: bool,
        reply: Replier<WeightsVersion>,
    ) {
        let checked = if self.update.is_some() {
            Err(Error::WeightUpdate(
                "another weight update is in progress; retry when it has finished".into(),
            ))
        } else if self.info.world_size > 1 && matches!(source, WeightSource::Host(_)) {
            Err(Error::WeightUpdate(format!(
                "this engine spans {} tensor-parallel ranks: tensors in host memory reach one-rank engines only; give a checkpoint directory every rank can read (WeightSource::Dir, POST /v1/models/{{key}}/weights)",
                self.info.world_size
            )))
        } else {
            self.check_update(source).map_err(as_update_error)
        };
        match checked {
            Ok(weights) => {
                tracing::info!(drain, "weight update asked; admission paused");
                self.update = Some(PendingUpdate {
                    weights,
                    drain,
                    reply,
                    asked: Instant::now(),
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "weight update refused; the old weights keep serving");
                reply.send(Err(e));
            }
        }
    }

    /// Checks new weights against the model (names, shapes, dtypes, byte counts; a
    /// checkpoint's headers and config), writing nothing.
    fn check_update(&self, source: WeightSource) -> Result<CheckedWeights> {
        let cfg = &self.cfg;
        let model = self.runner.qwen3();
        match source {
            WeightSource::Dir(dir) => {
                let files = crate::engine::model::files::safetensors_in(&dir)?;
                let config = dir.join("config.json");
                if config.is_file() && !cfg.same_shapes(&ModelConfig::from_file(&config)?) {
                    return Err(Error::WeightUpdate(format!(
                        "{}/config.json describes another shape of model than the one serving ({}); updates keep the architecture",
                        dir.display(),
                        cfg.shape_summary()
                    )));
                }
                let ck = Checkpoint::open(&self.info.key, &files, model.dtype(), model.device())?;
                let table = check_checkpoint(cfg, &ck, model.tied())?;
                self.on_workers(WorkerCommand::CheckWeights { dir: dir.clone() })?;
                Ok(CheckedWeights::Dir(dir, Box::new(ck), table))
            }
            WeightSource::Host(tensors) => {
                for t in &tensors {
                    check_tensor(cfg, &t.name, &t.shape, t.dtype)?;
                    let want = t.shape.iter().product::<usize>() * t.dtype.size_in_bytes();
                    if t.bytes.len() != want {
                        return Err(Error::WeightUpdate(format!(
                            "tensor `{}`: {} bytes, its dtype and shape make {want}",
                            t.name,
                            t.bytes.len()
                        )));
                    }
                }
                Ok(CheckedWeights::Host(tensors))
            }
        }
    }

    /// Whether admission is paused for a pending update (only sequences that started on the
    /// old weights are admitted, to finish).
    pub(super) fn admission_paused(&self) -> bool {
        self.update.is_some()
    }

    /// Whether `s` may be admitted now.
    pub(super) fn may_admit(&self, s: &Seq) -> bool {
        !self.admission_paused() || started(s)
    }

    /// Moves a pending update on: ends the old weights' requests when it does not drain,
    /// and applies it once none is left.
    pub(super) fn progress_update(&mut self) {
        let Some(u) = &self.update else {
            return;
        };
        if !u.drain {
            self.settle();
            let running = std::mem::take(&mut self.running);
            let (old, new): (Vec<Seq>, Vec<Seq>) = std::mem::take(&mut self.waiting)
                .into_iter()
                .partition(started);
            self.waiting = new.into();
            for s in running.into_iter().chain(old) {
                // A sequence swapped out while preempted gives its host reservation back.
                if s.swapped.is_some() {
                    self.kv.unreserve_swap(self.kv.blocks_for(s.computed));
                }
                self.finish(s, FinishReason::Interrupted);
            }
        }
        if !self.running.is_empty() || self.waiting.iter().any(started) {
            return;
        }
        self.settle();
        let u = self.update.take().expect("checked above");
        let t0 = Instant::now();
        let result = self.apply_update(u.weights).map_err(as_update_error);
        match &result {
            Ok(v) => tracing::info!(
                version = v.version,
                digest = %v.digest,
                apply_ms = t0.elapsed().as_millis() as u64,
                waited_ms = (t0 - u.asked).as_millis() as u64,
                "weights updated in place; prefix cache dropped"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "weight update failed while writing")
            }
        }
        u.reply.send(result);
        self.publish_stats();
    }

    /// Runs `cmd` on every worker rank (none: nothing to do); the first refusal names its
    /// rank.
    fn on_workers(&self, cmd: WorkerCommand) -> Result<()> {
        let Some(comm) = self.runner.comm() else {
            return Ok(());
        };
        let acks = comm.send_command(&cmd, self.opts.worker_timeout)?;
        for (i, a) in acks.into_iter().enumerate() {
            if let Err(reason) = a {
                return Err(Error::WeightUpdate(format!("rank {}: {reason}", i + 1)));
            }
        }
        Ok(())
    }

    /// Writes checked weights into the model and makes them the serving version.
    fn apply_update(&mut self, weights: CheckedWeights) -> Result<WeightsVersion> {
        let cfg = self.cfg.clone();
        let model = self.runner.qwen3();
        let digest = match weights {
            CheckedWeights::Dir(dir, ck, table) => {
                let digest = ck.digest()?;
                // Every rank checked these files: the workers write their shards first.
                self.on_workers(WorkerCommand::UpdateWeights { dir })
                    .map_err(|e| {
                        Error::WeightUpdate(format!(
                            "{e}; the ranks may now hold different weights: restart the server"
                        ))
                    })?;
                model.write_checkpoint(&cfg, &ck, &table)?;
                digest
            }
            CheckedWeights::Host(tensors) => {
                let parts: Vec<(&str, DType, &[usize], &[u8])> = tensors
                    .iter()
                    .map(|t| {
                        (
                            t.name.as_str(),
                            t.dtype,
                            t.shape.as_slice(),
                            t.bytes.as_slice(),
                        )
                    })
                    .collect();
                let digest = content_digest(&parts);
                for t in &tensors {
                    let v = Tensor::from_raw_buffer(&t.bytes, t.dtype, &t.shape, &Device::Cpu)?;
                    model.set_weight(&cfg, &t.name, &v)?;
                }
                digest
            }
        };
        self.runner.synchronize()?;
        let freed = self.kv.reset_prefix_cache();
        self.weights = WeightsVersion {
            version: self.weights.version + 1,
            digest,
            adapter: None,
        };
        self.reseed_tiers();
        tracing::debug!(
            freed_blocks = freed,
            "prefix cache of the old weights dropped"
        );
        Ok(self.weights.clone())
    }
}
