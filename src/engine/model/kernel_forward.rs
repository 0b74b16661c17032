//! The Qwen3 forward on the engine's own kernels. Per layer: add+RMSNorm and the qkv matmul,
//! the fused q/k norm + RoPE + KV write, paged attention, the o matmul, add+RMSNorm and the
//! gate|up matmul with SiLU*up, the down matmul, all written into buffers of the forward's
//! own. A pure decode step of 1-2 rows is 5 launches a layer (skinny-matmul kernels with the
//! norms fused in, `gemm.rs`; norm+RoPE+KV write+attention+merge in one kernel), and one of 3-8
//! rows on weights the tensor-core skinny matmuls take too (the presummed norm: o and down add
//! to the residual and sum its squares for the matmul after the norm, `gemm_presum.rs`); mixed
//! steps, long contexts (the attention unfused) and cuBLAS-sized batches take more.
//!
//! Invariants: the step's integer inputs (token ids, positions, cache slots, the decode
//! sequences' context lengths and block tables, the prefill tiles) go to the device in one
//! upload; nothing in the layer loop allocates, copies from the host or synchronizes (a
//! decode step's layers are what `crate::engine::runner::graphs` captures). Prefill chunks the kernels do not
//! serve attend through the gather path (`super::attention`).

use candle_core::Tensor;

use super::attention::AttnPlan;
pub use super::kernel_buffers::skip;
pub(crate) use super::kernel_buffers::{Activations, StepInputs};
use super::kv_cache::PagedKvCache;
use super::qwen3::{Ffn, Qwen3, reduce_at};
use crate::engine::batch::{SeqInput, logit_rows, positions_and_slots};
use crate::engine::cuda::CudaKernels;
use crate::engine::parallel::comm::CommBackend;
use crate::error::Result;

/// The Qwen3 forward on the engine's own kernels: the same weights as [`Qwen3`], the same
/// inputs and outputs as [`Qwen3::forward`].
#[derive(Clone, Copy)]
pub struct KernelForward<'a> {
    /// The weights.
    pub model: &'a Qwen3,
    /// The kernels, loaded for the model's dtype.
    pub kernels: &'a CudaKernels,
}

impl KernelForward<'_> {
    /// [`Qwen3::forward`] on the kernels (same inputs, same outputs).
    pub fn forward(
        &self,
        tokens: &[u32],
        seqs: &[SeqInput<'_>],
        cache: &PagedKvCache,
        comm: Option<&dyn CommBackend>,
    ) -> Result<Option<Tensor>> {
        let (inputs, plan, acts) = self.prepare(tokens, seqs, cache)?;
        self.layers_into(&inputs, &acts, &plan, cache, comm, None)?;
        self.logits(seqs, acts.h)
    }

    /// The logits of the rows `seqs` asks for, from the final normed states `h` (None on
    /// ranks above 0 and when no row asks).
    pub(super) fn logits(&self, seqs: &[SeqInput<'_>], h: Tensor) -> Result<Option<Tensor>> {
        let (m, k) = (self.model, self.kernels);
        let rows = logit_rows(seqs);
        if rows.is_empty() || m.shard().rank != 0 {
            return Ok(None);
        }
        let t = h.dim(0)?;
        let sel = if rows.len() == t {
            h
        } else {
            k.gather_rows(&h, &Tensor::new(rows.as_slice(), m.device())?)?
        };
        let logits = k.linear(&sel, m.lm_head.weight())?;
        Ok(Some(k.to_f32(&logits)?))
    }

    /// One step's inputs uploaded, its attention plan and its activation buffers.
    pub(super) fn prepare(
        &self,
        tokens: &[u32],
        seqs: &[SeqInput<'_>],
        cache: &PagedKvCache,
    ) -> Result<(StepInputs, AttnPlan, Activations)> {
        let (m, k) = (self.model, self.kernels);
        let bs = cache.block_size();
        let (positions, slots) = positions_and_slots(tokens, seqs, bs, m.max_positions())?;
        let t = tokens.len();
        let first = m.layers.first().map(|l| &l.attn);
        let group = first.map_or(1, |a| a.num_heads / a.num_kv_heads.max(1));
        let prefill_kernel = k.prefill_supports(group);
        let tile = k.prefill_tile(group);
        let decode: Vec<&SeqInput<'_>> = seqs.iter().filter(|s| s.q_len == 1).collect();
        let width = decode
            .iter()
            .map(|s| s.context_len.div_ceil(bs))
            .max()
            .unwrap_or(0);
        // One upload: ids | positions | slots | decode context lengths | decode block tables |
        // prefill tiles | prefill sequence metadata | prefill block tables.
        let mut packed = Vec::with_capacity(3 * t + decode.len() * (1 + width));
        packed.extend_from_slice(tokens);
        packed.extend_from_slice(&positions);
        packed.extend_from_slice(&slots);
        packed.extend(decode.iter().map(|s| s.context_len as u32));
        for s in &decode {
            let used = s.context_len.div_ceil(bs);
            packed.extend_from_slice(&s.block_table[..used]);
            packed.extend(std::iter::repeat_n(0u32, width - used));
        }
        let (mut tiles, mut meta, mut ptables) = (Vec::new(), Vec::new(), Vec::new());
        if prefill_kernel {
            let mut row = 0u32;
            for s in seqs {
                if s.q_len > 1 {
                    let idx = (meta.len() / 4) as u32;
                    for q0 in (0..s.q_len).step_by(tile) {
                        tiles.extend([idx, q0 as u32]);
                    }
                    let used = s.context_len.div_ceil(bs);
                    meta.extend([
                        row,
                        s.q_len as u32,
                        s.context_len as u32,
                        ptables.len() as u32,
                    ]);
                    ptables.extend_from_slice(&s.block_table[..used]);
                }
                row += s.q_len as u32;
            }
        }
        let pre_at = packed.len();
        packed.extend_from_slice(&tiles);
        packed.extend_from_slice(&meta);
        packed.extend_from_slice(&ptables);
        let lora_at = packed.len();
        let lora = m.lora.is_some() && seqs.iter().any(|s| s.adapter.is_some());
        let lora_tiles = if lora {
            super::lora_slots::kernel_tiles(seqs, t, Some(k))
        } else {
            Vec::new()
        };
        packed.extend_from_slice(&lora_tiles);
        let dev = m.device();
        let packed = Tensor::new(packed.as_slice(), dev)?;
        let ids = packed.narrow(0, 0, t)?;
        let nd = decode.len();
        let (ctx_lens, tables) = if nd > 0 {
            (
                packed.narrow(0, 3 * t, nd)?,
                packed.narrow(0, 3 * t + nd, nd * width)?,
            )
        } else {
            (ids.clone(), ids.clone())
        };
        let prefill = if tiles.is_empty() {
            (ids.clone(), ids.clone(), ids.clone())
        } else {
            (
                packed.narrow(0, pre_at, tiles.len())?,
                packed.narrow(0, pre_at + tiles.len(), meta.len())?,
                packed.narrow(0, pre_at + tiles.len() + meta.len(), ptables.len())?,
            )
        };
        let splits = k.step_splits(nd, width, bs, false);
        let longest = decode.iter().map(|s| s.context_len).max().unwrap_or(0);
        let inputs = StepInputs {
            pos: packed.narrow(0, t, t)?,
            slots: packed.narrow(0, 2 * t, t)?,
            ids,
            ctx_lens,
            tables,
            width: None,
            splits,
            prefill,
            prefill_keys: seqs
                .iter()
                .filter(|s| s.q_len > 1)
                .map(|s| s.context_len)
                .max()
                .unwrap_or(0),
            lora: if lora {
                Some(packed.narrow(0, lora_at, lora_tiles.len())?)
            } else {
                None
            },
            verify: false,
            runs: None,
            reduce_in_place: false,
            short_ctx: self.short_context(nd, splits, longest),
            long_ctx: k.fused_long_context(nd, longest),
            skip: 0,
        };
        let plan = AttnPlan::new(seqs, bs, dev, m.dtype(), true, prefill_kernel)?;
        let mut acts = Activations::new(k, m, t, nd, splits)?;
        if cache.dtype() == candle_core::DType::F8E4M3 && seqs.iter().any(|s| s.q_len > 1) {
            let (nkv, hd) = (m.local_kv_heads(), m.layers[0].attn.head_dim);
            acts.kv_new = Some((k.alloc_out((t, nkv, hd))?, k.alloc_out((t, nkv, hd))?));
        }
        Ok((inputs, plan, acts))
    }

    /// Layer `li`'s attention from `acts.qkv`: the fused decode launch (`fused`), or the q/k
    /// norm + RoPE + KV write and then the attention kernels; returns the attention output.
    pub(crate) fn layer_attention(
        &self,
        li: usize,
        (inputs, acts, plan, cache): (&StepInputs, &Activations, &AttnPlan, &PagedKvCache),
        (fused, part): (bool, usize),
    ) -> Result<Tensor> {
        let (m, k, a) = (self.model, self.kernels, acts);
        let at = &m.layers[li].attn;
        let bs = cache.block_size();
        let mut kv = cache.layer(li);
        kv.fresh = a.kv_new.as_ref().map(|(k, v)| (k, v));
        Ok(if fused {
            k.decode_fused_into(
                &a.qkv,
                (&at.q_norm.weight, &at.k_norm.weight, at.q_norm.eps),
                &m.inv_freq,
                (&inputs.pos, &inputs.slots),
                kv,
                (&inputs.tables, inputs.width.as_ref()),
                &inputs.ctx_lens,
                bs,
                &a.attn,
                (inputs.splits, part, a.scratch.as_ref(), &a.counters),
                inputs.short_ctx,
            )?;
            a.attn.clone()
        } else {
            k.qk_norm_rope_kv_write_into(
                &a.qkv,
                (&at.q_norm.weight, &at.k_norm.weight),
                &m.inv_freq,
                (&inputs.pos, &inputs.slots),
                kv,
                (at.num_heads, at.num_kv_heads, at.head_dim),
                at.q_norm.eps,
                &a.q,
            )?;
            self.attend_kernels(kv, plan, inputs, acts, bs)?
        })
    }

    /// Every layer and the final norm of one step, on `inputs`, into `acts` (`acts.h` ends as
    /// the normed last hidden state of every token). Allocates nothing, copies nothing from
    /// the host and never synchronizes when the step is pure decode on one rank, unless
    /// `trace` asks for copies of the intermediate states (`KernelForward::trace`).
    pub(crate) fn layers_into(
        &self,
        inputs: &StepInputs,
        acts: &Activations,
        plan: &AttnPlan,
        cache: &PagedKvCache,
        comm: Option<&dyn CommBackend>,
        mut trace: Option<&mut Vec<(String, Tensor)>>,
    ) -> Result<()> {
        let (m, k) = (self.model, self.kernels);
        let a = &acts;
        k.embedding_into(&m.embed, &inputs.ids, &a.residual[0])?;
        // Which residual buffer holds the stream; each add+norm with a delta moves it.
        let mut cur = 0;
        let mut delta: Option<Tensor> = None;
        // A pure decode step (every token a decode sequence, in order) of a small batch runs
        // each layer's attention as one fused launch.
        let t = a.h.dim(0)?;
        let fused = self.attention_fused(inputs, plan, t);
        let part = CudaKernels::decode_partition(inputs.ctx_lens.elem_count());
        // The overlap's deferred expands leave `a.o` without its delta: not with a trace of
        // it, nor with the all-reduce of tensor parallelism.
        let lora = self.lora_step(inputs, acts, comm.is_none() && trace.is_none())?;
        // The down whose LoRA expand the next add+RMSNorm takes over (overlap path).
        let mut down_before: Option<(usize, usize)> = None;
        // The presummed norm (`KernelOptions::norm_presum`, 3-8 rows): the matmul before a
        // norm left the sum in `residual[1 - cur]` and its squares in `a.ss`.
        let presum = lora.is_none() && comm.is_none() && trace.is_none();
        let mut presummed = false;
        let on = |op: u8| inputs.skip & op == 0;
        for (li, layer) in m.layers.iter().enumerate() {
            let at = &layer.attn;
            let norm = &layer.input_norm;
            // Each skinny matmul prefetches the next one's weights into L2 (with
            // `l2_prefetch`): qkv -> o (across the attention), o -> gate|up, gate|up -> down,
            // down -> the next layer's qkv.
            let res = (&a.residual[cur], delta.as_ref(), &a.residual[1 - cur]);
            match &lora {
                _ if !on(skip::QKV) => {}
                Some(l) => self.norm_linear_lora(
                    res,
                    norm,
                    &a.h,
                    at.qkv.weight(),
                    &a.qkv,
                    None,
                    ((l, li, 0), down_before),
                )?,
                None if presummed => {
                    let qkv_w = at.qkv.weight();
                    k.presum_linear_into(
                        res.2,
                        (&norm.weight, norm.eps),
                        &a.ss,
                        qkv_w,
                        &a.qkv,
                        None,
                    )?
                }
                None => k.norm_linear_into(
                    res,
                    (&norm.weight, norm.eps),
                    &a.h,
                    at.qkv.weight(),
                    &a.qkv,
                    None,
                    Some(at.o_proj.weight()),
                )?,
            }
            if delta.is_some() {
                cur = 1 - cur;
            }
            let out = match on(skip::ATTENTION) {
                true => self.layer_attention(li, (inputs, acts, plan, cache), (fused, part))?,
                false => a.attn.clone(),
            };
            let ffn_w = match &layer.ffn {
                Ffn::Dense(mlp) => mlp.gate_up.weight(),
                Ffn::Sparse(moe) => &moe.router,
            };
            let o_w = (&out, at.o_proj.weight(), &a.o);
            presummed = presum
                && matches!(&layer.ffn,
                    Ffn::Dense(d) if k.presum_serves(t, o_w.1, d.gate_up.weight()));
            if !on(skip::O) {
            } else if presummed {
                let sum = (&a.residual[cur], &a.residual[1 - cur]);
                k.linear_res_into(o_w.0, o_w.1, o_w.2, sum, &a.ss)?;
            } else {
                self.linear_lora(o_w, Some(ffn_w), lora.as_ref().map(|l| (l, li, 1)))?;
            }
            let o = reduce_at(&a.o, comm, inputs.reduce_in_place)?;
            let norm = &layer.post_norm;
            let res = (&a.residual[cur], Some(&o), &a.residual[1 - cur]);
            let mlp = match &layer.ffn {
                Ffn::Dense(mlp) => mlp,
                Ffn::Sparse(moe) => {
                    // The norm, the router's matmul, then the experts on the device.
                    let s = a
                        .moe
                        .as_ref()
                        .ok_or_else(|| crate::error::Error::Engine("MoE buffers missing".into()))?;
                    // The experts read the normed state, which the dense fused norm +
                    // matmul keeps in shared memory: here the norm and the router's matmul
                    // run as one launch that writes it (`moe_norm_router`, 1-2 rows) or apart.
                    let normw = (&norm.weight, norm.eps);
                    if on(skip::ROUTER)
                        && !k.moe_norm_router_into(res, normw, &a.h, &moe.router, &s.logits)?
                    {
                        k.add_rmsnorm_to(res.1, res.0, res.2, &norm.weight, norm.eps, &a.h)?;
                        k.linear_into(&a.h, &moe.router, &s.logits)?;
                    }
                    cur = 1 - cur;
                    let experts = (&moe.gate_up, &moe.down);
                    let how = (moe.first_expert, moe.norm_topk);
                    if on(skip::EXPERTS) {
                        k.moe_experts_into(&a.h, experts, how, s, &a.down)?;
                    }
                    delta = Some(reduce_at(&a.down, comm, inputs.reduce_in_place)?);
                    down_before = None;
                    self.trace_layer(trace.as_deref_mut(), li, &o, &a.residual[cur], &a.down)?;
                    continue;
                }
            };
            let gu_w = mlp.gate_up.weight();
            let silu = Some((&a.gu, &a.act));
            match &lora {
                _ if !on(skip::GATE_UP) => {}
                Some(l) => {
                    let lora = ((l, li, 2), Some((li, 1)));
                    self.norm_linear_lora(res, norm, &a.h, gu_w, &a.gu, silu, lora)?
                }
                None if presummed => {
                    let nw = (&norm.weight, norm.eps);
                    k.presum_linear_into(res.2, nw, &a.ss, gu_w, &a.gu, Some(&a.act))?
                }
                None => k.norm_linear_into(
                    res,
                    (&norm.weight, norm.eps),
                    &a.h,
                    gu_w,
                    &a.gu,
                    silu,
                    Some(mlp.down.weight()),
                )?,
            }
            cur = 1 - cur;
            let next = m.layers.get(li + 1).map(|l| l.attn.qkv.weight());
            let down_w = (&a.act, mlp.down.weight(), &a.down);
            presummed = presum && next.is_some_and(|q| k.presum_serves(t, down_w.1, q));
            if !on(skip::DOWN) {
            } else if presummed {
                let sum = (&a.residual[cur], &a.residual[1 - cur]);
                k.linear_res_into(down_w.0, down_w.1, down_w.2, sum, &a.ss)?;
            } else {
                self.linear_lora(down_w, next, lora.as_ref().map(|l| (l, li, 3)))?;
            }
            down_before = Some((li, 3));
            delta = Some(reduce_at(&a.down, comm, inputs.reduce_in_place)?);
            self.trace_layer(trace.as_deref_mut(), li, &o, &a.residual[cur], &a.down)?;
        }
        let res = (&a.residual[cur], delta.as_ref(), &a.residual[1 - cur]);
        match &lora {
            Some(l) => self.lora_norm_into(res, &m.norm, &a.h, (l, down_before)),
            None => k.add_rmsnorm_to(res.1, res.0, res.2, &m.norm.weight, m.norm.eps, &a.h),
        }
    }
}
