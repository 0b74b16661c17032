//! Weight updates on the scheduler thread: an update waits until nothing that started on the
//! old weights is left (drain), or ends those requests (`drain: false`), then writes the new
//! tensors into the model in place, drops the prefix cache and bumps the version.
//!
//! Invariants: a request runs start to finish on one version (the one its `Generation`
//! reports); new requests wait while an update is pending (nobody is refused); a refused
//! update writes nothing (every tensor is checked before the first write).

use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use super::core::Scheduler;
use super::seq::{PendingUpdate, Seq};
use crate::engine::model::config::ModelConfig;
use crate::engine::model::update::check_tensor;
use crate::engine::model::weights::Checkpoint;
use crate::engine::request::FinishReason;
use crate::engine::update::{WeightSource, WeightsVersion, content_digest};
use crate::error::{Error, Result};

/// Whether a sequence has started on the current weights (admitted once: running, or
/// preempted back to the queue).
fn started(s: &Seq) -> bool {
    s.admitted.is_some()
}

impl Scheduler {
    /// Takes an update request; a second one while one is pending is refused.
    pub(super) fn ask_update(&mut self, u: PendingUpdate) {
        if self.update.is_some() {
            u.reply.send(Err(Error::WeightUpdate(
                "another weight update is in progress; retry when it has finished".into(),
            )));
            return;
        }
        if self.info.world_size > 1 {
            u.reply.send(Err(Error::WeightUpdate(format!(
                "this engine spans {} tensor-parallel ranks and weight updates run on one rank only for now; serve the model with --world-size 1 to update it in place",
                self.info.world_size
            ))));
            return;
        }
        tracing::info!(drain = u.drain, "weight update asked; admission paused");
        self.update = Some(u);
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
                self.finish(s, FinishReason::Interrupted);
            }
        }
        if !self.running.is_empty() || self.waiting.iter().any(started) {
            return;
        }
        self.settle();
        let u = self.update.take().expect("checked above");
        let t0 = Instant::now();
        let result = self.apply_update(u.source).map_err(|e| match e {
            Error::WeightUpdate(_) => e,
            other => Error::WeightUpdate(other.to_string()),
        });
        match &result {
            Ok(v) => tracing::info!(
                version = v.version,
                digest = %v.digest,
                apply_ms = t0.elapsed().as_millis() as u64,
                waited_ms = (t0 - u.asked).as_millis() as u64,
                "weights updated in place; prefix cache dropped"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "weight update refused; the old weights keep serving")
            }
        }
        u.reply.send(result);
        self.publish_stats();
    }

    fn apply_update(&mut self, source: WeightSource) -> Result<WeightsVersion> {
        let cfg = self.cfg.clone();
        let model = self.runner.qwen3();
        let digest = match source {
            WeightSource::Dir(dir) => {
                let files = crate::engine::model::files::safetensors_in(&dir)
                    .map_err(|e| Error::WeightUpdate(e.to_string()))?;
                let config = dir.join("config.json");
                if config.is_file()
                    && !cfg.same_shapes(
                        &ModelConfig::from_file(&config)
                            .map_err(|e| Error::WeightUpdate(e.to_string()))?,
                    )
                {
                    return Err(Error::WeightUpdate(format!(
                        "{}/config.json describes another shape of model than the one serving ({}); updates keep the architecture",
                        dir.display(),
                        cfg.shape_summary()
                    )));
                }
                let ck = Checkpoint::open(&self.info.key, &files, model.dtype(), model.device())?;
                let digest = ck.digest()?;
                model.update_from(&cfg, &ck, || {})?;
                digest
            }
            WeightSource::Host(tensors) => {
                for t in &tensors {
                    check_tensor(&cfg, &t.name, &t.shape, t.dtype)?;
                    let want = t.shape.iter().product::<usize>() * t.dtype.size_in_bytes();
                    if t.bytes.len() != want {
                        return Err(Error::WeightUpdate(format!(
                            "tensor `{}`: {} bytes, its dtype and shape make {want}",
                            t.name,
                            t.bytes.len()
                        )));
                    }
                }
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
        };
        tracing::debug!(
            freed_blocks = freed,
            "prefix cache of the old weights dropped"
        );
        Ok(self.weights.clone())
    }
}
