//! `Shard`: which part of a tensor-parallel model a rank holds, and how weights are split.

use candle_core::Tensor;

use super::config::ModelConfig;
use crate::error::Result;

/// Which part of the model this rank holds (tensor parallelism; `Shard::FULL` for one rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
}

impl Shard {
    /// The whole model on one rank.
    pub const FULL: Shard = Shard { rank: 0, world: 1 };

    /// Checks that `world` divides every split dimension of `cfg`.
    pub fn check(&self, cfg: &ModelConfig) -> Result<()> {
        let w = self.world;
        let bad = [
            ("num_attention_heads", cfg.num_attention_heads),
            ("num_key_value_heads", cfg.num_key_value_heads),
            ("intermediate_size", cfg.intermediate_size),
        ]
        .into_iter()
        .filter(|(_, n)| w == 0 || n % w != 0)
        .map(|(name, n)| format!("{name} = {n}"))
        .collect::<Vec<_>>();
        if !bad.is_empty() {
            return Err(crate::error::Error::Unsupported(format!(
                "tensor-parallel world size {w} does not divide {}; use a world size that divides the head counts and the MLP size",
                bad.join(", ")
            )));
        }
        Ok(())
    }

    /// This rank's rows `[rank * n / world, (rank + 1) * n / world)` of dimension `dim`.
    pub(crate) fn slice(&self, t: Tensor, dim: usize) -> Result<Tensor> {
        if self.world == 1 {
            return Ok(t);
        }
        let n = t.dim(dim)? / self.world;
        Ok(t.narrow(dim, self.rank * n, n)?.contiguous()?)
    }
}
