//! Qwen3 forward over a paged KV cache.
//!
//! One forward takes a flat varlen batch: the new tokens of every sequence back to back, each
//! sequence with its position offset and block table. KV of the new tokens is written into the
//! cache slots its block table names, then attention reads the whole context back through the
//! block table. Attention goes through `attend`, the gather path: it gathers each
//! sequence's K/V by slot index. A fused paged-attention kernel can replace `attend` without
//! changing the batch format or the scheduler.
//!
//! Invariants: for every sequence `context_len >= q_len`, the block table covers
//! `context_len` tokens, and the `q_len` new tokens sit at positions
//! `context_len - q_len .. context_len`.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Linear, RmsNorm};

use super::comm::CommBackend;
use super::config::ModelConfig;
use super::weights::Checkpoint;
use crate::error::Result;

/// One sequence of a varlen batch.
#[derive(Debug, Clone)]
pub struct SeqInput<'a> {
    /// New tokens of this sequence in the batch (1 for a decode step).
    pub q_len: usize,
    /// Tokens in the context after this step (cached + new).
    pub context_len: usize,
    /// The sequence's KV blocks, in order.
    pub block_table: &'a [u32],
    /// Which rows of logits to return: none, the last token's, or every new token's.
    pub logits: LogitRows,
}

/// Which logits rows a sequence wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// No logits (a prefill chunk that does not end the prompt).
    None,
    /// The last new token's row (the next-token distribution).
    Last,
    /// Every new token's row (scoring).
    All,
}

/// The KV memory: per layer one K and one V tensor, head-major: `[kv_heads, num_blocks * block_size, head_dim]`,
/// so that gathering a sequence's slots yields per-head contiguous matrices.
pub struct PagedKvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    block_size: usize,
    num_blocks: usize,
}

impl PagedKvCache {
    /// Allocates `num_blocks` blocks of `block_size` tokens for every layer.
    /// `kv_heads` is the number of KV heads this rank holds.
    pub fn new(
        cfg: &ModelConfig,
        kv_heads: usize,
        num_blocks: usize,
        block_size: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let shape = (kv_heads, num_blocks * block_size, cfg.head_dim());
        let mut k = Vec::with_capacity(cfg.num_hidden_layers);
        let mut v = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            k.push(Tensor::zeros(shape, dtype, device)?);
            v.push(Tensor::zeros(shape, dtype, device)?);
        }
        Ok(Self {
            k,
            v,
            block_size,
            num_blocks,
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Copies the KV of `blocks` to host memory (for swap-out), one tensor per layer and K/V.
    pub fn read_blocks(&self, blocks: &[u32]) -> Result<Vec<(Tensor, Tensor)>> {
        let idx = self.block_slots(blocks)?;
        let host = Device::Cpu;
        self.k
            .iter()
            .zip(&self.v)
            .map(|(k, v)| {
                Ok((
                    k.index_select(&idx, 1)?.to_device(&host)?,
                    v.index_select(&idx, 1)?.to_device(&host)?,
                ))
            })
            .collect()
    }

    /// Writes KV read by [`PagedKvCache::read_blocks`] into `blocks` (for swap-in).
    pub fn write_blocks(&self, blocks: &[u32], data: &[(Tensor, Tensor)]) -> Result<()> {
        let idx = self.block_slots(blocks)?;
        for ((k, v), (hk, hv)) in self.k.iter().zip(&self.v).zip(data) {
            let dev = k.device();
            scatter_rows(k, &idx, &hk.to_device(dev)?)?;
            scatter_rows(v, &idx, &hv.to_device(dev)?)?;
        }
        Ok(())
    }

    fn block_slots(&self, blocks: &[u32]) -> Result<Tensor> {
        let bs = self.block_size as u32;
        let slots: Vec<u32> = blocks
            .iter()
            .flat_map(|b| (0..bs).map(move |o| b * bs + o))
            .collect();
        let dev = self.k[0].device();
        Ok(Tensor::new(slots.as_slice(), dev)?)
    }
}

/// Writes `src` (`[kv_heads, n, head_dim]`) into the slots `idx` (u32 `[n]`) of a head-major
/// cache tensor (`[kv_heads, slots, head_dim]`), in place.
fn scatter_rows(dst: &Tensor, idx: &Tensor, src: &Tensor) -> Result<()> {
    let (heads, n, hd) = src.dims3()?;
    let idx = idx
        .reshape((1, n, 1))?
        .broadcast_as((heads, n, hd))?
        .contiguous()?;
    dst.scatter_set(&idx, &src.contiguous()?, 1)?;
    Ok(())
}

struct Layer {
    input_norm: RmsNorm,
    qkv: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    o_proj: Linear,
    post_norm: RmsNorm,
    gate_up: Linear,
    down: Linear,
}

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
    fn slice(&self, t: Tensor, dim: usize) -> Result<Tensor> {
        if self.world == 1 {
            return Ok(t);
        }
        let n = t.dim(dim)? / self.world;
        Ok(t.narrow(dim, self.rank * n, n)?.contiguous()?)
    }
}

/// Qwen3 weights plus RoPE tables.
pub struct Qwen3 {
    embed: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    device: Device,
    dtype: DType,
    shard: Shard,
}

fn rms(ck: &Checkpoint, name: &str, size: usize, eps: f64) -> Result<RmsNorm> {
    Ok(RmsNorm::new(ck.get(name, &[size])?, eps))
}

impl Qwen3 {
    /// Loads this rank's shard of the weights of `cfg` from a checkpoint (HF tensor names),
    /// fusing q/k/v and gate/up into one matmul each: q/k/v and gate/up are split by output
    /// rows (column-parallel), o_proj and down by input columns (row-parallel, all-reduced in
    /// `forward`). Embedding, norms and lm_head are replicated. `progress` runs per layer.
    pub fn load(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        dtype: DType,
        device: &Device,
        shard: Shard,
        mut progress: impl FnMut(),
    ) -> Result<Self> {
        shard.check(cfg)?;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let (nh, nkv, inter) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.intermediate_size,
        );
        let eps = cfg.rms_norm_eps;
        let embed = ck.get("model.embed_tokens.weight", &[cfg.vocab_size, h])?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let w = |n: &str, shape: &[usize]| ck.get(&format!("{p}.{n}"), shape);
            let rows = |n: &str, shape: &[usize]| shard.slice(w(n, shape)?, 0);
            let q = rows("self_attn.q_proj.weight", &[nh * hd, h])?;
            let k = rows("self_attn.k_proj.weight", &[nkv * hd, h])?;
            let v = rows("self_attn.v_proj.weight", &[nkv * hd, h])?;
            let qkv_bias = if cfg.attention_bias {
                Some(Tensor::cat(
                    &[
                        rows("self_attn.q_proj.bias", &[nh * hd])?,
                        rows("self_attn.k_proj.bias", &[nkv * hd])?,
                        rows("self_attn.v_proj.bias", &[nkv * hd])?,
                    ],
                    0,
                )?)
            } else {
                None
            };
            let gate = rows("mlp.gate_proj.weight", &[inter, h])?;
            let up = rows("mlp.up_proj.weight", &[inter, h])?;
            let o_proj = shard.slice(w("self_attn.o_proj.weight", &[h, nh * hd])?, 1)?;
            let down = shard.slice(w("mlp.down_proj.weight", &[h, inter])?, 1)?;
            layers.push(Layer {
                input_norm: rms(ck, &format!("{p}.input_layernorm.weight"), h, eps)?,
                qkv: Linear::new(Tensor::cat(&[q, k, v], 0)?, qkv_bias),
                // The attention scale 1/sqrt(head_dim) is folded into q_norm's weight (RoPE is
                // linear), which saves one op per layer and step.
                q_norm: RmsNorm::new(
                    (ck.get(&format!("{p}.self_attn.q_norm.weight"), &[hd])?
                        * (1.0 / (hd as f64).sqrt()))?,
                    eps,
                ),
                k_norm: rms(ck, &format!("{p}.self_attn.k_norm.weight"), hd, eps)?,
                o_proj: Linear::new(o_proj, None),
                post_norm: rms(ck, &format!("{p}.post_attention_layernorm.weight"), h, eps)?,
                gate_up: Linear::new(Tensor::cat(&[gate, up], 0)?, None),
                down: Linear::new(down, None),
            });
            progress();
        }
        let norm = rms(ck, "model.norm.weight", h, eps)?;
        let lm_head = if cfg.tie_word_embeddings && !ck.has("lm_head.weight") {
            Linear::new(embed.clone(), None)
        } else {
            Linear::new(ck.get("lm_head.weight", &[cfg.vocab_size, h])?, None)
        };
        let (cos, sin) = rope_tables(cfg, dtype, device)?;
        Ok(Self {
            embed,
            layers,
            norm,
            lm_head,
            cos,
            sin,
            num_heads: nh / shard.world,
            num_kv_heads: nkv / shard.world,
            head_dim: hd,
            intermediate: inter / shard.world,
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

    /// This rank's shard.
    pub fn shard(&self) -> Shard {
        self.shard
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
        let total: usize = seqs.iter().map(|s| s.q_len).sum();
        if total != tokens.len() || total == 0 {
            return Err(candle_core::Error::msg(format!(
                "batch has {} tokens but its sequences hold {total}",
                tokens.len()
            ))
            .into());
        }
        let bs = cache.block_size;
        let mut positions = Vec::with_capacity(total);
        let mut write_slots = Vec::with_capacity(total);
        for s in seqs {
            if s.q_len == 0 || s.context_len < s.q_len || s.block_table.len() * bs < s.context_len {
                return Err(candle_core::Error::msg(format!(
                    "bad sequence in batch: q_len {} context {} blocks {}",
                    s.q_len,
                    s.context_len,
                    s.block_table.len()
                ))
                .into());
            }
            for p in s.context_len - s.q_len..s.context_len {
                positions.push(p as u32);
                write_slots.push(s.block_table[p / bs] * bs as u32 + (p % bs) as u32);
            }
        }
        let dev = &self.device;
        let ids = Tensor::new(tokens, dev)?;
        let pos = Tensor::new(positions.as_slice(), dev)?;
        let slot_t = Tensor::new(write_slots.as_slice(), dev)?;
        let (nkv, hd) = (self.num_kv_heads, self.head_dim);
        let slot_idx = slot_t
            .reshape((1, total, 1))?
            .broadcast_as((nkv, total, hd))?
            .contiguous()?;
        let cos = self.cos.index_select(&pos, 0)?.unsqueeze(1)?; // [T, 1, D/2]
        let sin = self.sin.index_select(&pos, 0)?.unsqueeze(1)?;
        let plan = AttnPlan::new(seqs, bs, dev, self.dtype)?;

        let mut x = self.embed.index_select(&ids, 0)?; // [T, hidden]
        for (li, layer) in self.layers.iter().enumerate() {
            let residual = x.clone();
            let hcur = layer.input_norm.forward(&x)?;
            let qkv = layer.qkv.forward(&hcur)?;
            let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
            let q = qkv.narrow(1, 0, nh * hd)?.reshape((total, nh, hd))?;
            let k = qkv
                .narrow(1, nh * hd, nkv * hd)?
                .reshape((total, nkv, hd))?;
            let v = qkv
                .narrow(1, (nh + nkv) * hd, nkv * hd)?
                .reshape((total, nkv, hd))?;
            let q = layer.q_norm.forward(&q.contiguous()?)?;
            let k = layer.k_norm.forward(&k.contiguous()?)?;
            // RoPE per token: treat tokens as the batch, one "time step" each.
            let q = candle_nn::rotary_emb::rope(&q.unsqueeze(2)?.contiguous()?, &cos, &sin)?
                .squeeze(2)?;
            let k = candle_nn::rotary_emb::rope(&k.unsqueeze(2)?.contiguous()?, &cos, &sin)?
                .squeeze(2)?;
            // Head-major cache: [kv_heads, slots, head_dim].
            cache.k[li].scatter_set(&slot_idx, &k.transpose(0, 1)?.contiguous()?, 1)?;
            cache.v[li].scatter_set(&slot_idx, &v.transpose(0, 1)?.contiguous()?, 1)?;
            let attn = attend(&q, &cache.k[li], &cache.v[li], &plan, nh, nkv, hd)?;
            x = (reduce(layer.o_proj.forward(&attn)?, comm)? + residual)?;
            let residual = x.clone();
            let hcur = layer.post_norm.forward(&x)?;
            let gu = layer.gate_up.forward(&hcur)?;
            let act = (candle_nn::ops::silu(&gu.narrow(1, 0, self.intermediate)?)?
                * gu.narrow(1, self.intermediate, self.intermediate)?)?;
            x = (reduce(layer.down.forward(&act)?, comm)? + residual)?;
        }
        let mut rows: Vec<u32> = Vec::new();
        let mut start = 0u32;
        for s in seqs {
            let n = s.q_len as u32;
            match s.logits {
                LogitRows::None => {}
                LogitRows::Last => rows.push(start + n - 1),
                LogitRows::All => rows.extend(start..start + n),
            }
            start += n;
        }
        if rows.is_empty() || self.shard.rank != 0 {
            return Ok(None);
        }
        let sel = x.index_select(&Tensor::new(rows.as_slice(), dev)?, 0)?;
        let logits = self.lm_head.forward(&self.norm.forward(&sel)?)?;
        Ok(Some(logits.to_dtype(DType::F32)?))
    }
}

/// Sums a row-parallel partial output over the ranks (no-op on one rank).
fn reduce(partial: Tensor, comm: Option<&dyn CommBackend>) -> Result<Tensor> {
    match comm {
        Some(c) if c.world_size() > 1 => c.all_reduce_sum(&partial),
        _ => Ok(partial),
    }
}

fn rope_tables(cfg: &ModelConfig, dtype: DType, dev: &Device) -> Result<(Tensor, Tensor)> {
    let dim = cfg.head_dim();
    let max = cfg.max_position_embeddings;
    let inv: Vec<f32> = (0..dim)
        .step_by(2)
        .map(|i| 1f32 / cfg.rope_theta.powf(i as f64 / dim as f64) as f32)
        .collect();
    let inv = Tensor::from_vec(inv, (1, dim / 2), dev)?;
    let t = Tensor::arange(0u32, max as u32, dev)?
        .to_dtype(DType::F32)?
        .reshape((max, 1))?;
    let freqs = t.matmul(&inv)?;
    Ok((freqs.cos()?.to_dtype(dtype)?, freqs.sin()?.to_dtype(dtype)?))
}

/// How attention runs for one batch: runs of decode sequences batched with a padding mask,
/// each prefill sequence on its own with a causal mask. Built once per forward, shared by layers.
struct AttnPlan {
    groups: Vec<AttnGroup>,
}

enum AttnGroup {
    /// `n` consecutive one-token sequences; `idx` `[n * max_ctx]` slot indices, `mask` `[1, n, 1, max_ctx]`.
    Decode {
        n: usize,
        max_ctx: usize,
        idx: Tensor,
        mask: Option<Tensor>,
    },
    /// One sequence with `q_len` new tokens over `ctx` context tokens; `mask` `[q_len, ctx]`.
    Prefill {
        q_len: usize,
        ctx: usize,
        idx: Tensor,
        mask: Option<Tensor>,
    },
}

impl AttnPlan {
    fn new(seqs: &[SeqInput<'_>], bs: usize, dev: &Device, dtype: DType) -> Result<Self> {
        let slots_of = |s: &SeqInput<'_>, out: &mut Vec<u32>| {
            for p in 0..s.context_len {
                out.push(s.block_table[p / bs] * bs as u32 + (p % bs) as u32);
            }
        };
        let mut groups = Vec::new();
        let mut i = 0;
        while i < seqs.len() {
            if seqs[i].q_len == 1 {
                let mut j = i;
                while j < seqs.len() && seqs[j].q_len == 1 {
                    j += 1;
                }
                let run = &seqs[i..j];
                let max_ctx = run.iter().map(|s| s.context_len).max().unwrap_or(1);
                let mut idx = Vec::with_capacity(run.len() * max_ctx);
                let mut mask = Vec::with_capacity(run.len() * max_ctx);
                for s in run {
                    slots_of(s, &mut idx);
                    let pad = max_ctx - s.context_len;
                    idx.extend(std::iter::repeat_n(idx[idx.len() - 1], pad));
                    mask.extend(std::iter::repeat_n(0f32, s.context_len));
                    mask.extend(std::iter::repeat_n(f32::NEG_INFINITY, pad));
                }
                groups.push(AttnGroup::Decode {
                    n: run.len(),
                    max_ctx,
                    idx: Tensor::new(idx.as_slice(), dev)?,
                    // No padding (every context equally long, batch 1 among them): no mask.
                    mask: if run.iter().all(|s| s.context_len == max_ctx) {
                        None
                    } else {
                        Some(
                            Tensor::from_vec(mask, (1, run.len(), 1, max_ctx), dev)?
                                .to_dtype(dtype)?,
                        )
                    },
                });
                i = j;
            } else {
                let s = &seqs[i];
                let mut idx = Vec::with_capacity(s.context_len);
                slots_of(s, &mut idx);
                let start = s.context_len - s.q_len;
                let mask: Vec<f32> = (0..s.q_len)
                    .flat_map(|qi| {
                        (0..s.context_len).map(move |kj| {
                            if kj <= start + qi {
                                0.0
                            } else {
                                f32::NEG_INFINITY
                            }
                        })
                    })
                    .collect();
                groups.push(AttnGroup::Prefill {
                    q_len: s.q_len,
                    ctx: s.context_len,
                    idx: Tensor::new(idx.as_slice(), dev)?,
                    mask: Some(
                        Tensor::from_vec(mask, (s.q_len, s.context_len), dev)?.to_dtype(dtype)?,
                    ),
                });
                i += 1;
            }
        }
        Ok(Self { groups })
    }
}

/// The gather path of paged attention: `q` `[T, heads, hd]` (post-RoPE) attends to the cached
/// K/V named by the plan. Returns `[T, heads * hd]`.
fn attend(
    q: &Tensor,
    kc: &Tensor,
    vc: &Tensor,
    plan: &AttnPlan,
    nh: usize,
    nkv: usize,
    hd: usize,
) -> Result<Tensor> {
    let g = nh / nkv;
    let mut outs = Vec::with_capacity(plan.groups.len());
    let mut t0 = 0;
    for group in &plan.groups {
        match group {
            AttnGroup::Decode {
                n,
                max_ctx,
                idx,
                mask,
            } => {
                let (n, l) = (*n, *max_ctx);
                // One query token: the G query heads of a KV head become the "query length".
                let qg = q
                    .narrow(0, t0, n)?
                    .reshape((n, nkv, g, hd))?
                    .transpose(0, 1)?
                    .contiguous()?; // [nkv, n, g, hd]
                // The head-major cache gathers straight into [nkv, n, l, hd]: no transpose.
                let k = kc.index_select(idx, 1)?.reshape((nkv, n, l, hd))?;
                let v = vc.index_select(idx, 1)?.reshape((nkv, n, l, hd))?;
                let scores = qg.matmul(&k.transpose(2, 3)?)?; // [nkv, n, g, l], q pre-scaled
                let scores = match mask {
                    Some(m) => scores.broadcast_add(m)?,
                    None => scores,
                };
                let p = candle_nn::ops::softmax_last_dim(&scores)?;
                let o = p.matmul(&v)?.transpose(0, 1)?.contiguous()?; // [n, nkv, g, hd]
                outs.push(o.reshape((n, nh * hd))?);
                t0 += n;
            }
            AttnGroup::Prefill {
                q_len,
                ctx,
                idx,
                mask,
            } => {
                let (n, c) = (*q_len, *ctx);
                let qs = q
                    .narrow(0, t0, n)?
                    .transpose(0, 1)?
                    .contiguous()?
                    .reshape((nkv, g * n, hd))?; // [nkv, g*n, hd]
                let k = kc.index_select(idx, 1)?; // [nkv, c, hd]
                let v = vc.index_select(idx, 1)?;
                let scores = qs.matmul(&k.transpose(1, 2)?)?.reshape((nkv, g, n, c))?;
                let scores = match mask {
                    Some(m) => scores.broadcast_add(m)?,
                    None => scores,
                };
                let p = candle_nn::ops::softmax_last_dim(&scores)?.reshape((nkv, g * n, c))?;
                let o = p.matmul(&v)?.reshape((nh, n, hd))?.transpose(0, 1)?; // [n, nh, hd]
                outs.push(o.contiguous()?.reshape((n, nh * hd))?);
                t0 += n;
            }
        }
    }
    let out = if outs.len() == 1 {
        outs.pop().expect("one group")
    } else {
        Tensor::cat(&outs, 0)?
    };
    Ok(out)
}
