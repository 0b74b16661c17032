//! `Shard`: which part of a tensor- or expert-parallel model a rank holds, and how weights are
//! split.
//!
//! Attention and dense MLPs are always tensor-parallel (heads and MLP rows split across the
//! ranks). The experts of an MoE layer are either tensor-parallel too (every rank holds a
//! slice of every expert) or, with `expert_parallel`, split whole: rank `r` holds experts
//! `r * E / world .. (r + 1) * E / world`. Either way every rank's output is a partial sum
//! the all-reduce completes.

use std::ops::Range;

use candle_core::Tensor;

use super::config::ModelConfig;
use crate::error::{Error, Result};

/// Which part of the model this rank holds (`Shard::FULL` for one rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// MoE experts are split whole across the ranks (expert parallelism) instead of each
    /// expert's MLP being sliced (tensor parallelism).
    pub expert_parallel: bool,
}

impl Shard {
    /// The whole model on one rank.
    pub const FULL: Shard = Shard {
        rank: 0,
        world: 1,
        expert_parallel: false,
    };

    /// Rank `rank` of `world`, tensor-parallel (experts sliced).
    pub fn tensor(rank: usize, world: usize) -> Self {
        Self {
            rank,
            world,
            expert_parallel: false,
        }
    }

    /// This shard with experts split whole across the ranks (`on`) or sliced.
    pub fn with_expert_parallel(mut self, on: bool) -> Self {
        self.expert_parallel = on;
        self
    }

    /// Checks that `world` divides every split dimension of `cfg` (heads, the dense MLP size,
    /// and the expert count with expert parallelism or each expert's MLP size without).
    pub fn check(&self, cfg: &ModelConfig) -> Result<()> {
        let w = self.world;
        if self.expert_parallel && !cfg.is_moe() {
            return Err(Error::Unsupported(format!(
                "expert parallelism (--expert-parallel) needs a mixture-of-experts checkpoint; this `{}` model has no experts",
                cfg.model_type
            )));
        }
        let dense = (0..cfg.num_hidden_layers).any(|l| !cfg.is_sparse_layer(l));
        let mut dims = vec![
            ("num_attention_heads", cfg.num_attention_heads),
            ("num_key_value_heads", cfg.num_key_value_heads),
        ];
        if dense {
            dims.push(("intermediate_size", cfg.intermediate_size));
        }
        if cfg.is_moe() {
            dims.push(if self.expert_parallel {
                ("num_experts", cfg.num_experts)
            } else {
                ("moe_intermediate_size", cfg.moe_intermediate_size)
            });
        }
        let bad = dims
            .into_iter()
            .filter(|(_, n)| w == 0 || n % w != 0)
            .map(|(name, n)| format!("{name} = {n}"))
            .collect::<Vec<_>>();
        if !bad.is_empty() {
            let kind = if self.expert_parallel {
                "expert-parallel"
            } else {
                "tensor-parallel"
            };
            return Err(Error::Unsupported(format!(
                "{kind} world size {w} does not divide {}; use a world size that divides the head counts, the MLP size{}",
                bad.join(", "),
                if self.expert_parallel {
                    " and the expert count"
                } else {
                    " and the experts' MLP size"
                }
            )));
        }
        Ok(())
    }

    /// The experts (of `n`) whose weights this rank holds: a contiguous range with expert
    /// parallelism, all of them (sliced) without.
    pub fn experts(&self, n: usize) -> Range<usize> {
        if self.expert_parallel && self.world > 1 {
            let per = n / self.world;
            self.rank * per..(self.rank + 1) * per
        } else {
            0..n
        }
    }

    /// This rank's slice of an expert's MLP along `dim`: whole with expert parallelism (the
    /// rank holds whole experts), else as [`Shard::slice`].
    pub(crate) fn slice_expert(&self, t: Tensor, dim: usize) -> Result<Tensor> {
        if self.expert_parallel {
            return Ok(t);
        }
        self.slice(t, dim)
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
