//! The sparse MLP of Qwen3-MoE ([`MoeBlock`]): a router picks each token's top-k experts, each
//! expert is a SwiGLU MLP, and the token's output is the routing-weighted sum of its experts'
//! outputs — transformers' `Qwen3MoeSparseMoeBlock`.
//!
//! Weights are stacked per layer: `gate_up` `[E_local, 2 * I, hidden]` (each expert's gate rows
//! then up rows, as the dense MLP's fused matrix) and `down` `[E_local, hidden, I]`. A rank holds
//! every expert sliced (tensor parallelism) or whole experts `first_expert..` (expert
//! parallelism, [`Shard::experts`]); either way its output is a partial sum the all-reduce
//! completes. Checkpoints name experts one by one (`mlp.experts.{e}.gate_proj.weight`, the
//! published layout) or stacked (`mlp.experts.gate_up_proj` `[E, 2I, hidden]` and
//! `mlp.experts.down_proj` `[E, hidden, I]`, transformers 5's own); both load.
//!
//! Routing follows the HF math: router logits in the compute dtype, softmax in f32, top-k
//! (ties to the lower expert id), renormalized when `norm_topk_prob`, then cast to the compute
//! dtype before weighting; experts add their rows in ascending expert order.

use candle_core::{DType, Tensor};

use super::blocks::{Kx, cat0};
use super::config::ModelConfig;
use super::shard::Shard;
use super::weights::Checkpoint;
use crate::error::{Error, Result};

/// One sparse layer's router and this rank's experts.
pub struct MoeBlock {
    /// Router `[E, hidden]` (every expert's row, on every rank).
    pub(crate) router: Tensor,
    /// This rank's experts' gate|up rows, `[E_local, 2 * I_local, hidden]`.
    pub(crate) gate_up: Tensor,
    /// This rank's experts' down projections, `[E_local, hidden, I_local]`.
    pub(crate) down: Tensor,
    /// The first expert this rank holds (its experts are `first_expert..first_expert +
    /// E_local`).
    pub(crate) first_expert: usize,
    /// Experts per token.
    pub(crate) top_k: usize,
    /// Whether the top-k weights are renormalized to sum to 1.
    pub(crate) norm_topk: bool,
    /// Each expert's MLP inner size on this rank.
    pub(crate) intermediate: usize,
}

/// Each token's experts and weights (`top_k` per token, token-major), as the router chose.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// Expert ids, `[tokens * top_k]`.
    pub experts: Vec<u32>,
    /// Their weights (f32, before the cast to the compute dtype).
    pub weights: Vec<f32>,
}

/// The top-`k` experts of each row of `probs` (softmax outputs, f32 `[T, E]`), largest first
/// (ties: the lower id), their weights renormalized to sum to 1 when `norm`.
pub fn route(probs: &[Vec<f32>], k: usize, norm: bool) -> Routing {
    let mut experts = Vec::with_capacity(probs.len() * k);
    let mut weights = Vec::with_capacity(probs.len() * k);
    let mut order: Vec<u32> = Vec::new();
    for row in probs {
        order.clear();
        order.extend(0..row.len() as u32);
        // Stable: equal probabilities keep ascending ids.
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
        let top = &order[..k.min(order.len())];
        let sum: f32 = top.iter().map(|&e| row[e as usize]).sum();
        for &e in top {
            experts.push(e);
            let w = row[e as usize];
            weights.push(if norm { w / sum } else { w });
        }
    }
    Routing { experts, weights }
}

impl MoeBlock {
    /// Loads layer `p`'s router and this rank's experts. A missing expert tensor, a router of
    /// the wrong expert count or an expert of the wrong size is refused naming the tensor.
    pub(crate) fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        p: &str,
        shard: Shard,
        kx: Kx<'_>,
    ) -> Result<Self> {
        let (h, e, inter) = (cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size);
        let router = ck.get(&format!("{p}.mlp.gate.weight"), &[e, h])?;
        let mine = shard.experts(e);
        let local = mine.len();
        let stacked = format!("{p}.mlp.experts.gate_up_proj");
        let (gate_up, down) = if ck.has(&stacked) {
            let gu = ck.get(&stacked, &[e, 2 * inter, h])?;
            let dn = ck.get(&format!("{p}.mlp.experts.down_proj"), &[e, h, inter])?;
            let gu = gu.narrow(0, mine.start, local)?;
            let dn = dn.narrow(0, mine.start, local)?;
            if shard.expert_parallel || shard.world == 1 {
                (gu.contiguous()?, dn.contiguous()?)
            } else {
                let g = shard.slice(gu.narrow(1, 0, inter)?, 1)?;
                let u = shard.slice(gu.narrow(1, inter, inter)?, 1)?;
                (Tensor::cat(&[g, u], 1)?, shard.slice(dn, 2)?)
            }
        } else {
            let mut rows = Vec::with_capacity(2 * local);
            let mut downs = Vec::with_capacity(local);
            for x in mine.clone() {
                let w = |n: &str, shape: &[usize]| {
                    ck.get(&format!("{p}.mlp.experts.{x}.{n}.weight"), shape)
                };
                rows.push(shard.slice_expert(w("gate_proj", &[inter, h])?, 0)?);
                rows.push(shard.slice_expert(w("up_proj", &[inter, h])?, 0)?);
                downs.push(shard.slice_expert(w("down_proj", &[h, inter])?, 1)?);
            }
            let il = rows[0].dim(0)?;
            let gu = cat0(&rows, kx)?.reshape((local, 2 * il, h))?;
            let dn = cat0(&downs, kx)?.reshape((local, h, il))?;
            (gu, dn)
        };
        let intermediate = down.dim(2)?;
        Ok(Self {
            router,
            gate_up,
            down,
            first_expert: mine.start,
            top_k: cfg.num_experts_per_tok,
            norm_topk: cfg.norm_topk_prob,
            intermediate,
        })
    }

    /// Experts this rank holds.
    pub fn local_experts(&self) -> usize {
        self.gate_up.dims()[0]
    }

    /// The router's choice for `x` `[T, hidden]` (normed): logits in the compute dtype,
    /// softmax in f32, top-k on the host.
    pub fn route(&self, x: &Tensor) -> Result<Routing> {
        let logits = x.matmul(&self.router.t()?)?.to_dtype(DType::F32)?;
        let probs = candle_nn::ops::softmax_last_dim(&logits)?.to_vec2::<f32>()?;
        Ok(route(&probs, self.top_k, self.norm_topk))
    }

    /// `x` `[T, hidden]` (normed) -> this rank's partial output `[T, hidden]` (candle ops; the
    /// CPU and the reference the kernels are checked against).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let routing = self.route(x)?;
        self.experts_forward(x, &routing)
    }

    /// This rank's experts applied to `x` as `routing` says, summed per token.
    pub fn experts_forward(&self, x: &Tensor, routing: &Routing) -> Result<Tensor> {
        experts_forward(
            x,
            (&self.gate_up, &self.down),
            (self.first_expert, self.top_k),
            routing,
        )
    }
}

/// Experts `first..first + E_local` (stacked `gate_up` `[E_local, 2I, hidden]`, `down`
/// `[E_local, hidden, I]`) applied to `x` `[T, hidden]` as `routing` (top-`k`) says, summed
/// per token in ascending expert order, in candle ops: the reference the kernels are checked
/// against (`kernel_check`).
pub fn experts_forward(
    x: &Tensor,
    (gate_up, down): (&Tensor, &Tensor),
    (first, k): (usize, usize),
    routing: &Routing,
) -> Result<Tensor> {
    let (t, h) = x.dims2()?;
    if routing.experts.len() != t * k || routing.weights.len() != t * k {
        return Err(Error::Engine(format!(
            "MoE routing holds {} choices for {t} tokens of top-{k}",
            routing.experts.len()
        )));
    }
    let local = gate_up.dim(0)?;
    let n = down.dim(2)?;
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); local];
    let mut ws: Vec<Vec<f32>> = vec![Vec::new(); local];
    for (i, (&e, &w)) in routing.experts.iter().zip(&routing.weights).enumerate() {
        let e = e as usize;
        if e >= first && e < first + local {
            rows[e - first].push((i / k) as u32);
            ws[e - first].push(w);
        }
    }
    let dev = x.device();
    let mut out = Tensor::zeros((t, h), x.dtype(), dev)?;
    for (le, (r, w)) in rows.iter().zip(&ws).enumerate() {
        if r.is_empty() {
            continue;
        }
        let idx = Tensor::new(r.as_slice(), dev)?;
        let xs = x.index_select(&idx, 0)?;
        let gu = xs.matmul(&gate_up.get(le)?.t()?)?;
        let act = (candle_nn::ops::silu(&gu.narrow(1, 0, n)?)? * gu.narrow(1, n, n)?)?;
        let y = act.matmul(&down.get(le)?.t()?)?;
        // HF casts the weights to the compute dtype before multiplying.
        let w = Tensor::new(w.as_slice(), dev)?
            .to_dtype(x.dtype())?
            .unsqueeze(1)?;
        let y = y.broadcast_mul(&w)?;
        out = out.index_add(&idx, &y, 0)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn top_k_picks_the_largest_breaks_ties_low_and_renormalizes() {
        let probs = vec![vec![0.1, 0.4, 0.1, 0.4], vec![0.7, 0.1, 0.15, 0.05]];
        let r = route(&probs, 2, false);
        assert_eq!(r.experts, [1, 3, 0, 2]);
        assert_eq!(r.weights, [0.4, 0.4, 0.7, 0.15]);
        let r = route(&probs, 2, true);
        assert!((r.weights[0] - 0.5).abs() < 1e-6);
        assert!((r.weights[2] - 0.7 / 0.85).abs() < 1e-6);
        assert!((r.weights[2] + r.weights[3] - 1.0).abs() < 1e-6);
    }
}
