//! Qwen3 over a paged KV cache, in the shape of candle's model files: [`Attention`], [`Mlp`]
//! and a decoder layer, each with `load` and `forward`, and [`Qwen3`] on top.
//!
//! One forward takes a flat varlen batch: the new tokens of every sequence back to back, each
//! sequence with its position offset and block table. The new tokens' KV is written into the
//! cache slots their block table names, then attention reads the whole context back through
//! the block table (`super::attention`, one interface for the gather path and the kernels).
//!
//! Invariants: for every sequence `context_len >= q_len`, the block table covers
//! `context_len` tokens, and the `q_len` new tokens sit at positions
//! `context_len - q_len .. context_len`.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::Linear;

use super::attention::{AttnPlan, attend};
use super::blocks::{Kx, Norm, cat0, inv_freq, rms, rope_tables};
use super::config::ModelConfig;
use super::kv_cache::PagedKvCache;
use super::lora_slots::{LoraSlots, Segment, segments};
use super::moe::MoeBlock;
use super::shard::Shard;
use super::weights::Checkpoint;
use crate::engine::batch::{SeqInput, logit_rows, positions_and_slots};
use crate::engine::parallel::comm::CommBackend;
use crate::error::Result;

/// What every layer of one forward shares: RoPE rows of the new tokens, their cache slots,
/// the attention plan, the cache and the tensor-parallel link.
struct StepContext<'a> {
    total: usize,
    cos: Tensor,
    sin: Tensor,
    slot_idx: Tensor,
    plan: AttnPlan,
    cache: &'a PagedKvCache,
    comm: Option<&'a dyn CommBackend>,
    /// The adapters' slots and the batch's segments over them, when a row has an adapter.
    lora: Option<(&'a LoraSlots, Vec<Segment>)>,
}

impl StepContext<'_> {
    /// `base` (the output of group `g`'s matmul of layer `li` on `x`) plus the LoRA delta of
    /// the rows on an adapter.
    fn lora(&self, base: Tensor, li: usize, g: usize, x: &Tensor) -> Result<Tensor> {
        let Some((slots, segs)) = &self.lora else {
            return Ok(base);
        };
        Ok(match slots.delta(li, g, x, segs)? {
            Some(d) => (base + d)?,
            None => base,
        })
    }
}

/// Self-attention with q/k RMSNorm and RoPE; q/k/v fused into one matmul.
pub struct Attention {
    pub(crate) qkv: Linear,
    pub(crate) q_norm: Norm,
    pub(crate) k_norm: Norm,
    pub(crate) o_proj: Linear,
    pub(crate) num_heads: usize,
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
}

impl Attention {
    /// Loads layer `p`'s attention (this rank's heads: q/k/v by output rows, o_proj by input
    /// columns).
    fn load(cfg: &ModelConfig, ck: &Checkpoint, p: &str, shard: Shard, kx: Kx<'_>) -> Result<Self> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let eps = cfg.rms_norm_eps;
        let w = |n: &str, shape: &[usize]| ck.get(&format!("{p}.self_attn.{n}"), shape);
        let rows = |n: &str, shape: &[usize]| shard.slice(w(n, shape)?, 0);
        let q = rows("q_proj.weight", &[nh * hd, h])?;
        let k = rows("k_proj.weight", &[nkv * hd, h])?;
        let v = rows("v_proj.weight", &[nkv * hd, h])?;
        let bias = if cfg.attention_bias {
            Some(cat0(
                &[
                    rows("q_proj.bias", &[nh * hd])?,
                    rows("k_proj.bias", &[nkv * hd])?,
                    rows("v_proj.bias", &[nkv * hd])?,
                ],
                kx,
            )?)
        } else {
            None
        };
        Ok(Self {
            qkv: Linear::new(cat0(&[q, k, v], kx)?, bias),
            // The attention scale 1/sqrt(head_dim) is folded into q_norm's weight (RoPE is
            // linear), which saves one op per layer and step.
            q_norm: Norm::new(
                (ck.get_on(&format!("{p}.self_attn.q_norm.weight"), &[hd], &Device::Cpu)?
                    * (1.0 / (hd as f64).sqrt()))?
                .to_device(ck.device())?,
                eps,
            ),
            k_norm: rms(ck, &format!("{p}.self_attn.k_norm.weight"), hd, eps)?,
            o_proj: Linear::new(shard.slice(w("o_proj.weight", &[h, nh * hd])?, 1)?, None),
            num_heads: nh / shard.world,
            num_kv_heads: nkv / shard.world,
            head_dim: hd,
        })
    }

    /// `x` `[T, hidden]` (normed) -> this rank's partial attention output `[T, hidden]`;
    /// writes the new tokens' K/V of layer `li` into the cache.
    fn forward(&self, x: &Tensor, li: usize, ctx: &StepContext<'_>) -> Result<Tensor> {
        let (nh, nkv, hd, t) = (self.num_heads, self.num_kv_heads, self.head_dim, ctx.total);
        let qkv = ctx.lora(self.qkv.forward(x)?, li, 0, x)?;
        let q = qkv.narrow(1, 0, nh * hd)?.reshape((t, nh, hd))?;
        let k = qkv.narrow(1, nh * hd, nkv * hd)?.reshape((t, nkv, hd))?;
        let v = qkv
            .narrow(1, (nh + nkv) * hd, nkv * hd)?
            .reshape((t, nkv, hd))?;
        let q = self.q_norm.forward(&q.contiguous()?)?;
        let k = self.k_norm.forward(&k.contiguous()?)?;
        // RoPE per token: tokens are the batch, one "time step" each.
        let rope = |x: &Tensor| -> Result<Tensor> {
            let x = x.unsqueeze(2)?.contiguous()?;
            Ok(candle_nn::rotary_emb::rope(&x, &ctx.cos, &ctx.sin)?.squeeze(2)?)
        };
        let (q, k) = (rope(&q)?, rope(&k)?);
        ctx.cache.write(li, &k, &v, &ctx.slot_idx)?;
        let mut kv = ctx.cache.layer(li);
        if kv.is_fp8() {
            kv.fresh = Some((&k, &v));
        }
        let attn = attend(&q, kv, &ctx.plan, nh, nkv, hd)?;
        ctx.lora(self.o_proj.forward(&attn)?, li, 1, &attn)
    }
}

/// SwiGLU MLP; gate and up fused into one matmul.
pub struct Mlp {
    pub(crate) gate_up: Linear,
    pub(crate) down: Linear,
    pub(crate) intermediate: usize,
}

impl Mlp {
    /// Loads layer `p`'s MLP (gate/up by output rows, down by input columns).
    fn load(cfg: &ModelConfig, ck: &Checkpoint, p: &str, shard: Shard, kx: Kx<'_>) -> Result<Self> {
        let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let w = |n: &str, shape: &[usize]| ck.get(&format!("{p}.mlp.{n}"), shape);
        let gate = shard.slice(w("gate_proj.weight", &[inter, h])?, 0)?;
        let up = shard.slice(w("up_proj.weight", &[inter, h])?, 0)?;
        Ok(Self {
            gate_up: Linear::new(cat0(&[gate, up], kx)?, None),
            down: Linear::new(shard.slice(w("down_proj.weight", &[h, inter])?, 1)?, None),
            intermediate: inter / shard.world,
        })
    }

    /// `x` `[T, hidden]` (normed) -> this rank's partial output `[T, hidden]`.
    fn forward(&self, x: &Tensor, li: usize, ctx: &StepContext<'_>) -> Result<Tensor> {
        let gu = ctx.lora(self.gate_up.forward(x)?, li, 2, x)?;
        let n = self.intermediate;
        let act = (candle_nn::ops::silu(&gu.narrow(1, 0, n)?)? * gu.narrow(1, n, n)?)?;
        ctx.lora(self.down.forward(&act)?, li, 3, &act)
    }
}

/// A layer's feed-forward part: a dense SwiGLU MLP or a sparse mixture of experts.
pub(crate) enum Ffn {
    Dense(Mlp),
    Sparse(MoeBlock),
}

impl Ffn {
    /// The dense MLP (None: a sparse layer).
    pub(crate) fn dense(&self) -> Option<&Mlp> {
        match self {
            Ffn::Dense(m) => Some(m),
            Ffn::Sparse(_) => None,
        }
    }

    /// The mixture of experts (None: a dense layer).
    pub(crate) fn sparse(&self) -> Option<&MoeBlock> {
        match self {
            Ffn::Dense(_) => None,
            Ffn::Sparse(m) => Some(m),
        }
    }
}

/// One decoder layer: pre-norm attention and MLP (dense or experts), each with a residual.
pub(crate) struct Layer {
    pub(crate) input_norm: Norm,
    pub(crate) attn: Attention,
    pub(crate) post_norm: Norm,
    pub(crate) ffn: Ffn,
}

impl Layer {
    fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        i: usize,
        shard: Shard,
        kx: Kx<'_>,
    ) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Self {
            input_norm: rms(ck, &format!("{p}.input_layernorm.weight"), h, eps)?,
            attn: Attention::load(cfg, ck, &p, shard, kx)?,
            post_norm: rms(ck, &format!("{p}.post_attention_layernorm.weight"), h, eps)?,
            ffn: if cfg.is_sparse_layer(i) {
                Ffn::Sparse(MoeBlock::load(cfg, ck, &p, shard, kx)?)
            } else {
                Ffn::Dense(Mlp::load(cfg, ck, &p, shard, kx)?)
            },
        })
    }

    fn forward(&self, x: &Tensor, li: usize, ctx: &StepContext<'_>) -> Result<Tensor> {
        let h = self.attn.forward(&self.input_norm.forward(x)?, li, ctx)?;
        let x = (reduce(h, ctx.comm)? + x)?;
        let normed = self.post_norm.forward(&x)?;
        let h = match &self.ffn {
            Ffn::Dense(mlp) => mlp.forward(&normed, li, ctx)?,
            Ffn::Sparse(moe) => moe.forward(&normed)?,
        };
        Ok((reduce(h, ctx.comm)? + x)?)
    }
}

/// Qwen3 weights plus RoPE tables.
pub struct Qwen3 {
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Norm,
    pub(crate) lm_head: Linear,
    /// The LoRA adapters' slots (None: adapters are not enabled on this engine).
    pub(crate) lora: Option<LoraSlots>,
    /// lm_head is the embedding matrix (one tensor under two names).
    tied: bool,
    cos: Tensor,
    sin: Tensor,
    /// RoPE inverse frequencies (f32 `[head_dim / 2]`), for the kernels.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) inv_freq: Tensor,
    num_kv_heads: usize,
    head_dim: usize,
    device: Device,
    dtype: DType,
    shard: Shard,
}

impl Qwen3 {
    /// Loads this rank's shard of the weights of `cfg` from a checkpoint (HF tensor names):
    /// q/k/v and gate/up are split by output rows (column-parallel), o_proj and down by input
    /// columns (row-parallel, all-reduced in `forward`); embedding, norms and lm_head are
    /// replicated. RoPE tables cover `max_context` positions. `kx`: the kernels that stack
    /// weights on the device while loading (none: candle ops). `progress` runs per layer.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        dtype: DType,
        device: &Device,
        shard: Shard,
        max_context: usize,
        kx: Kx<'_>,
        mut progress: impl FnMut(),
    ) -> Result<Self> {
        shard.check(cfg)?;
        let h = cfg.hidden_size;
        let embed = ck.get("model.embed_tokens.weight", &[cfg.vocab_size, h])?;
        let mut layers = Vec::new();
        for i in 0..cfg.num_hidden_layers {
            layers.push(Layer::load(cfg, ck, i, shard, kx)?);
            progress();
        }
        let norm = rms(ck, "model.norm.weight", h, cfg.rms_norm_eps)?;
        let tied = cfg.tie_word_embeddings && !ck.has("lm_head.weight");
        let lm_head = if tied {
            Linear::new(embed.clone(), None)
        } else {
            Linear::new(ck.get("lm_head.weight", &[cfg.vocab_size, h])?, None)
        };
        let (cos, sin) = rope_tables(cfg, max_context, dtype, device)?;
        let inv_freq = Tensor::from_vec(inv_freq(cfg), cfg.head_dim() / 2, device)?;
        Ok(Self {
            embed,
            layers,
            norm,
            lm_head,
            lora: None,
            tied,
            cos,
            sin,
            inv_freq,
            num_kv_heads: cfg.num_key_value_heads / shard.world,
            head_dim: cfg.head_dim(),
            device: device.clone(),
            dtype,
            shard,
        })
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The KV heads this rank holds.
    pub fn local_kv_heads(&self) -> usize {
        self.num_kv_heads
    }

    /// Whether lm_head is the embedding matrix itself (tied embeddings, no `lm_head.weight`
    /// in the checkpoint it was loaded from).
    pub fn tied(&self) -> bool {
        self.tied
    }

    /// This rank's shard.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// The positions the RoPE tables cover (the longest context this model serves).
    pub fn max_positions(&self) -> usize {
        self.cos.dims()[0]
    }

    /// Runs one varlen batch. `tokens` holds every sequence's new tokens back to back, in the
    /// order of `seqs`. Returns the requested logits rows (f32, `[rows, vocab]`) in order, or
    /// `None` when no sequence asked for any.
    ///
    /// With tensor parallelism every rank calls this with the same batch and `comm`; the
    /// row-parallel outputs are all-reduced; only rank 0 computes logits.
    pub fn forward(
        &self,
        tokens: &[u32],
        seqs: &[SeqInput<'_>],
        cache: &PagedKvCache,
        comm: Option<&dyn CommBackend>,
    ) -> Result<Option<Tensor>> {
        let bs = cache.block_size();
        let (positions, write_slots) = positions_and_slots(tokens, seqs, bs, self.max_positions())?;
        let total = tokens.len();
        let dev = &self.device;
        let pos = Tensor::new(positions.as_slice(), dev)?;
        let (nkv, hd) = (self.num_kv_heads, self.head_dim);
        let ctx = StepContext {
            total,
            cos: self.cos.index_select(&pos, 0)?.unsqueeze(1)?, // [T, 1, D/2]
            sin: self.sin.index_select(&pos, 0)?.unsqueeze(1)?,
            slot_idx: Tensor::new(write_slots.as_slice(), dev)?
                .reshape((1, total, 1))?
                .broadcast_as((nkv, total, hd))?
                .contiguous()?,
            plan: AttnPlan::new(seqs, bs, dev, self.dtype, false, false)?,
            cache,
            comm,
            lora: self
                .lora
                .as_ref()
                .filter(|_| seqs.iter().any(|s| s.adapter.is_some()))
                .map(|l| (l, segments(seqs))),
        };
        let mut x = self.embed.index_select(&Tensor::new(tokens, dev)?, 0)?; // [T, hidden]
        for (li, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x, li, &ctx)?;
        }
        let rows = logit_rows(seqs);
        if rows.is_empty() || self.shard.rank != 0 {
            return Ok(None);
        }
        let sel = x.index_select(&Tensor::new(rows.as_slice(), dev)?, 0)?;
        let logits = self.lm_head.forward(&self.norm.forward(&sel)?)?;
        Ok(Some(logits.to_dtype(DType::F32)?))
    }
}

/// Sums a row-parallel partial output over the ranks (no-op on one rank).
pub(crate) fn reduce(partial: Tensor, comm: Option<&dyn CommBackend>) -> Result<Tensor> {
    match comm {
        Some(c) if c.world_size() > 1 => c.all_reduce_sum(&partial),
        _ => Ok(partial),
    }
}

/// [`reduce`] of a buffer, written back into it when `in_place` (a CUDA graph's static
/// activations: the captured step allocates nothing), else into a new tensor.
#[cfg(feature = "cuda")]
pub(crate) fn reduce_at(
    partial: &Tensor,
    comm: Option<&dyn CommBackend>,
    in_place: bool,
) -> Result<Tensor> {
    match comm {
        Some(c) if c.world_size() > 1 && in_place => {
            c.all_reduce_sum_in_place(partial)?;
            Ok(partial.clone())
        }
        _ => reduce(partial.clone(), comm),
    }
}
