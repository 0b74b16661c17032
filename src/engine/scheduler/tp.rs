//! The head's side of tensor parallelism: the settings workers must mirror, the per-step
//! agreement before collectives, and the forward that sends each step to the workers first.

use std::time::Duration;

use candle_core::{DType, Device};

use super::Scheduler;
use crate::engine::EngineOptions;
use crate::engine::comm::{CommBackend, RankSettings, SeqCommand, WorkerCommand};
use crate::engine::config::ModelConfig;
use crate::engine::qwen3::SeqInput;
use crate::error::{Error, Result};

pub(super) const HELLO_TIMEOUT: Duration = Duration::from_secs(900);

/// The settings the head sends its workers (they must have the same).
pub(crate) fn rank_settings(
    cfg: &ModelConfig,
    opts: &EngineOptions,
    dtype: DType,
    num_blocks: usize,
) -> RankSettings {
    RankSettings {
        block_size: opts.block_size,
        num_blocks,
        dtype: format!("{dtype:?}").to_lowercase(),
        speculative_tokens: opts.speculative_tokens,
        model: format!(
            "{}:{}x{}",
            cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size
        ),
    }
}

/// All ranks agree whether every one of them can run the step: a failure anywhere makes all
/// skip it, so no rank waits in a collective for one that will not come.
pub(crate) fn agree(comm: &dyn CommBackend, ok: bool, device: &Device) -> Result<bool> {
    let flag = candle_core::Tensor::new(&[if ok { 0f32 } else { 1f32 }], device)?;
    let total: Vec<f32> = comm
        .all_reduce_sum(&flag)?
        .to_dtype(DType::F32)?
        .to_vec1()?;
    Ok(total[0] == 0.0)
}

impl Scheduler {
    /// One forward over the model: on a tensor-parallel head, the command goes to every worker
    /// first and the ranks agree that all of them took it before the first collective.
    pub(super) fn forward(
        &self,
        tokens: &[u32],
        inputs: &[SeqInput<'_>],
    ) -> Result<Option<candle_core::Tensor>> {
        let Some(comm) = self.comm.clone() else {
            return self.model.forward(tokens, inputs, &self.cache, None);
        };
        let step = self.steps_sent.get() + 1;
        self.steps_sent.set(step);
        let cmd = WorkerCommand::Forward {
            step,
            tokens: tokens.to_vec(),
            seqs: inputs
                .iter()
                .map(|s| SeqCommand {
                    q_len: s.q_len,
                    context_len: s.context_len,
                    block_table: s.block_table.to_vec(),
                })
                .collect(),
        };
        let acks = comm.send_command(&cmd, self.opts.worker_timeout)?;
        let refused: Vec<String> = acks
            .into_iter()
            .enumerate()
            .filter_map(|(i, a)| a.err().map(|e| format!("rank {}: {e}", i + 1)))
            .collect();
        agree(comm.as_ref(), refused.is_empty(), self.model.device())?;
        if !refused.is_empty() {
            return Err(Error::Engine(format!(
                "a worker failed this step ({})",
                refused.join("; ")
            )));
        }
        self.model
            .forward(tokens, inputs, &self.cache, Some(comm.as_ref()))
    }
}
