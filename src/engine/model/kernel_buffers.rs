//! The kernel forward's buffers: [`StepInputs`] (device views of one step's integer inputs,
//! all slices of one upload) and [`Activations`] (one buffer per intermediate, reused by
//! every layer), shared by the eager forward (`kernel_forward.rs`) and the CUDA graphs
//! (`crate::engine::runner::graphs`), which hold one set for their whole life.

use candle_core::Tensor;

use super::qwen3::Qwen3;
use crate::engine::cuda::{CudaKernels, FUSED_MAX_ROWS, MoeScratch};
use crate::error::Result;

/// Device views of one step's integer inputs (all slices of one upload).
pub(crate) struct StepInputs {
    pub(crate) ids: Tensor,
    pub(crate) pos: Tensor,
    /// Cache slot per token (`u32::MAX`: a padding row that writes no KV).
    pub(crate) slots: Tensor,
    /// Context length per decode sequence.
    pub(crate) ctx_lens: Tensor,
    /// Decode block tables, `[decode sequences, width]` row-major.
    pub(crate) tables: Tensor,
    /// The tables' width on the device (u32 `[1]`), when it is not `tables`' shape (graphs).
    pub(crate) width: Option<Tensor>,
    /// Partitions of decode attention (each at least
    /// [`CudaKernels::decode_partition`] of the decode sequences' count long).
    pub(crate) splits: usize,
    /// Prefill tiles, sequence metadata and block tables (`kernels/prefill.cu`).
    pub(crate) prefill: (Tensor, Tensor, Tensor),
    /// The longest context among the prefill chunks (the keys the prefill attends to).
    pub(crate) prefill_keys: usize,
    /// The LoRA tiles of the step (u32 `[tiles, 3]`: first token, count, slot; see
    /// `CudaKernels::lora_into`), when a row of it runs on an adapter.
    pub(crate) lora: Option<Tensor>,
    /// Decode rows may be consecutive positions of one sequence (a graph replaying a step
    /// that verifies speculative drafts, one row per position): a row's attention reads KV
    /// that other rows write in the same step, so every layer writes all rows' KV before
    /// any row attends (the fused decode attention, which writes and reads in one launch,
    /// is not used).
    pub(crate) verify: bool,
    /// With `verify`, where each row sits in its sequence's run of rows (u32 `[B]`,
    /// `(j << 16) | n`: row `j` of `n`), for the shared-K/V verify attention
    /// (`CudaKernels::paged_verify_into`); `None`: rows attend one at a time.
    pub(crate) runs: Option<Tensor>,
    /// Tensor parallelism: sum the ranks' partial outputs in their own buffers (a graph's
    /// static activations), not into new tensors.
    pub(crate) reduce_in_place: bool,
    /// Every decode context fits one cluster of the fused attention: its tensor-core kernels
    /// may run (`CudaKernels::fused_short_context`, `KernelOptions::fused_mma`).
    pub(crate) short_ctx: bool,
    /// The longest decode context passes the step's bound (`KernelOptions::fused_long_ctx`,
    /// `_one`, `_many`; `CudaKernels::fused_long_context`): the attention runs unfused.
    pub(crate) long_ctx: bool,
    /// Profiling only (`DecodeGraphs::set_profile_skip`; 0 in the engine): the ops of every
    /// layer whose [`skip`] bits are set are not launched, so a graph replay times the step
    /// without them. What the step computes is then meaningless.
    pub(crate) skip: u8,
}

/// The ops a profiling capture can leave out of a step (`StepInputs::skip`, set by
/// `DecodeGraphs::set_profile_skip`), one bit each.
pub mod skip {
    /// The add+RMSNorm and qkv matmul.
    pub const QKV: u8 = 1;
    /// The attention (fused: q/k norm, RoPE, KV write, attention, merge).
    pub const ATTENTION: u8 = 2;
    /// The o matmul.
    pub const O: u8 = 4;
    /// The add+RMSNorm and gate|up matmul with SiLU*up.
    pub const GATE_UP: u8 = 8;
    /// The down matmul.
    pub const DOWN: u8 = 16;
    /// The lm_head and the f32 logits (graph captures).
    pub const HEAD: u8 = 32;
    /// MoE layers: the add+RMSNorm and the router's matmul.
    pub const ROUTER: u8 = 64;
    /// MoE layers: the experts (routing, gate|up, down and their sum).
    pub const EXPERTS: u8 = 128;
}

/// The forward's activations: one buffer each, reused by every layer (on one stream a layer's
/// writes come after the previous layer's reads of the same buffer).
pub(crate) struct Activations {
    /// The residual stream, in two buffers: each add+norm reads one and writes the sum to
    /// the other (a fused kernel's blocks must not see each other's writes).
    pub(crate) residual: [Tensor; 2],
    /// The normed hidden state (after the last layer: the final norm's output).
    pub(crate) h: Tensor,
    pub(super) qkv: Tensor,
    pub(super) q: Tensor,
    pub(super) attn: Tensor,
    pub(super) o: Tensor,
    pub(super) gu: Tensor,
    pub(super) act: Tensor,
    pub(super) down: Tensor,
    /// The sparse layers' buffers, on an MoE model.
    pub(super) moe: Option<MoeScratch>,
    /// The presummed norm's partial sums of squares (f32 `[presum_len(hidden)]`,
    /// `KernelOptions::norm_presum`).
    pub(super) ss: Tensor,
    /// Decode-attention partials (None with one partition).
    pub(super) scratch: Option<(Tensor, Tensor)>,
    /// Merge counters of the fused decode attention (one per row and head, kept zero), for
    /// the rows it serves (at most [`FUSED_MAX_ROWS`]).
    pub(super) counters: Tensor,
    /// The LoRA shrink's f32 scratch (`[t, 3 * rank]`), on a model with adapter slots.
    pub(crate) lora_y: Option<Tensor>,
    /// The wide matmuls' outputs (`[t, out + slots·P·R]` per group: qkv, o, gate|up, down),
    /// on a model whose slots store `a` after the base weights (`KernelOptions::lora_wide`),
    /// for steps of up to `LORA_TILE_ONE_MAX` rows.
    pub(crate) lora_wide: Option<[Tensor; 4]>,
    /// A step with prefill over an fp8 cache: the tokens' K and V unrounded
    /// (`[t, kv_heads, head_dim]`), which the prefill attends to for its chunks' own keys.
    pub(super) kv_new: Option<(Tensor, Tensor)>,
}

impl Activations {
    /// Buffers for `t` tokens, `nd` of them decode sequences attended in `splits` partitions
    /// (the scratch holds `nd * splits` partials per head).
    pub(crate) fn new(
        k: &CudaKernels,
        m: &Qwen3,
        t: usize,
        nd: usize,
        splits: usize,
    ) -> Result<Self> {
        let Some(l0) = m.layers.first() else {
            return Err(crate::error::Error::Engine("a model without layers".into()));
        };
        let (nh, hd) = (l0.attn.num_heads, l0.attn.head_dim);
        let hidden = m.embed.dim(1)?;
        // Dense layers' buffers (a model of sparse layers only keeps token-sized stubs).
        let (gu_n, act_n) = m
            .layers
            .iter()
            .find_map(|l| l.ffn.dense())
            .map_or(Ok((2, 1)), |d| -> Result<_> {
                Ok((d.gate_up.weight().dim(0)?, d.intermediate))
            })?;
        let moe = match m.layers.iter().find_map(|l| l.ffn.sparse()) {
            Some(s) => {
                Some(k.moe_scratch(t, (s.router.dim(0)?, s.top_k), s.intermediate, hidden)?)
            }
            None => None,
        };
        Ok(Self {
            residual: [k.alloc_out((t, hidden))?, k.alloc_out((t, hidden))?],
            h: k.alloc_out((t, hidden))?,
            qkv: k.alloc_out((t, l0.attn.qkv.weight().dim(0)?))?,
            q: k.alloc_out((t, nh, hd))?,
            attn: k.alloc_out((t, nh * hd))?,
            o: k.alloc_out((t, hidden))?,
            gu: k.alloc_out((t, gu_n))?,
            act: k.alloc_out((t, act_n))?,
            moe,
            down: k.alloc_out((t, hidden))?,
            ss: k.alloc(
                crate::engine::cuda::presum_len(hidden),
                candle_core::DType::F32,
            )?,
            scratch: k.decode_scratch(nd, nh, splits)?,
            counters: k.decode_counters(t.min(FUSED_MAX_ROWS), nh)?,
            lora_y: match &m.lora {
                Some(l) => {
                    let cols = crate::engine::cuda::lora_scratch_cols(l.rank(), k.lora_grouped());
                    Some(k.alloc((t, cols), candle_core::DType::F32)?)
                }
                None => None,
            },
            lora_wide: match &m.lora {
                Some(l) if l.is_wide() && k.lora_wide() => {
                    let rows = t.min(crate::engine::cuda::LORA_TILE_ONE_MAX);
                    let g = |i: usize| -> Result<Tensor> {
                        let cols = l.layers[0][i].wide.as_ref().map_or(Ok(0), |w| w.dim(0))?;
                        k.alloc_out((rows, cols))
                    };
                    Some([g(0)?, g(1)?, g(2)?, g(3)?])
                }
                _ => None,
            },
            kv_new: None,
        })
    }

    /// The first `t` rows of every buffer (a graph bucket's share of the largest bucket's);
    /// the decode-attention scratch is shared whole (its layout follows each launch's grid).
    pub(crate) fn rows(&self, t: usize) -> Result<Self> {
        let n = |x: &Tensor| -> Result<Tensor> { Ok(x.narrow(0, 0, t)?) };
        Ok(Self {
            residual: [n(&self.residual[0])?, n(&self.residual[1])?],
            h: n(&self.h)?,
            qkv: n(&self.qkv)?,
            q: n(&self.q)?,
            attn: n(&self.attn)?,
            o: n(&self.o)?,
            gu: n(&self.gu)?,
            act: n(&self.act)?,
            down: n(&self.down)?,
            moe: self.moe.as_ref().map(|s| s.rows(t)).transpose()?,
            ss: self.ss.clone(),
            scratch: self.scratch.clone(),
            counters: self.counters.clone(),
            lora_y: self.lora_y.as_ref().map(n).transpose()?,
            lora_wide: match &self.lora_wide {
                Some([a, b, c, d]) if t <= a.dim(0)? => Some([n(a)?, n(b)?, n(c)?, n(d)?]),
                _ => None,
            },
            kv_new: None,
        })
    }

    /// Bytes these buffers hold.
    pub(crate) fn bytes(&self) -> usize {
        let b = |x: &Tensor| x.elem_count() * x.dtype().size_in_bytes();
        let mut n = [
            &self.residual[0],
            &self.residual[1],
            &self.h,
            &self.qkv,
            &self.q,
            &self.attn,
            &self.o,
            &self.gu,
            &self.act,
            &self.down,
        ]
        .iter()
        .map(|x| b(x))
        .sum::<usize>();
        if let Some((a, m)) = &self.scratch {
            n += b(a) + b(m);
        }
        if let Some(y) = &self.lora_y {
            n += b(y);
        }
        n += self.lora_wide.iter().flatten().map(b).sum::<usize>();
        if let Some(s) = &self.moe {
            n += s.bytes();
        }
        n + b(&self.counters) + b(&self.ss)
    }
}
