//! Launches of the decode attention kernels (`kernels/decode.cu`, `fused_decode.cu`): paged
//! decode (flash-decoding with a merge of partitions), fused or not; prefill is `prefill.rs`.

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};

use super::kernels::{CudaKernels, DECODE_PARTITION};
use super::launch::kernel_err;
use super::params::{DecodeGeometry, DecodeParams, FusedDecodeParams};
use crate::engine::kv_format::KvRef;
use crate::error::Result;

/// Most blocks per cluster of the fused decode attention (16 for GQA groups of up to 2, 8 for
/// 4; `CLUSTER_PART` tokens each at most for a context one cluster covers,
/// `kernels/fused_decode.cu`). 16 is above CUDA's portable cluster size: the functions are
/// loaded with non-portable cluster sizes allowed (sm_90 has them).
pub const DECODE_CLUSTER: usize = 16;

/// Most decode sequences a step runs through the fused decode attention: above, the unfused
/// kernels are faster (the GPU is busy, and the fused kernel's per-partition q/k RoPE and
/// in-kernel merge cost more than the two launches they save: on the H200, 0.6B at batch 256
/// 29,000 fused vs 35,200 tok/s unfused, batch 32 13,200 vs 14,500).
pub const FUSED_MAX_ROWS: usize = 16;

/// Most decode sequences whose fused attention runs in clusters: small batches, whose few
/// partitions leave most SMs idle, so the merge's latency is the step's.
pub const CLUSTER_MAX_ROWS: usize = 16;

/// Most decode sequences whose GQA-group-8 attention runs fused as two group-4 halves
/// (`LaunchOptions::gqa8_split`): on the H200 (30B-A3B shape, ctx 600) one launch 11.1 us at
/// batch 1 against 3.0 + 8.5 unfused, but 24.4 against 3.0 + 8.8 at batch 8.
pub const GQA8_SPLIT_MAX_ROWS: usize = 2;

impl CudaKernels {
    /// Scratch for [`CudaKernels::paged_decode_into`]: partial results of `b` sequences in
    /// `splits` partitions (`None` when one partition covers them). One per forward, reused by
    /// every layer (launches on one stream do not overlap).
    pub fn decode_scratch(
        &self,
        b: usize,
        nh: usize,
        splits: usize,
    ) -> Result<Option<(Tensor, Tensor)>> {
        if splits <= 1 || b == 0 {
            return Ok(None);
        }
        Ok(Some((
            self.alloc((b, nh, splits, 128), DType::F32)?,
            self.alloc((b, nh, splits, 2), DType::F32)?,
        )))
    }

    /// Decode attention over the paged caches: q `[B, nh, 128]` (pre-scaled), block tables
    /// u32 `[B, W]`, context lengths u32 `[B]`. Returns `[B, nh * 128]`.
    pub fn paged_decode(
        &self,
        q: &Tensor,
        kv: KvRef<'_>,
        block_tables: &Tensor,
        ctx_lens: &Tensor,
        block_size: usize,
    ) -> Result<Tensor> {
        let (b, nh, hd) = q.dims3()?;
        let out = self.alloc((b, nh * hd), self.dtype)?;
        let w = block_tables.dim(1)?;
        let part = Self::decode_partition(b);
        let splits = Self::decode_splits(w, block_size, part);
        let scratch = self.decode_scratch(b, nh, splits)?;
        self.paged_decode_into(
            q,
            kv,
            (block_tables, None),
            ctx_lens,
            block_size,
            &out,
            (splits, part, scratch.as_ref()),
        )?;
        Ok(out)
    }

    /// Context tokens per flash-decoding partition for a batch of `b` decode sequences:
    /// short partitions in small batches, which alone would leave most SMs idle, up to
    /// 256 in large ones.
    pub fn decode_partition(b: usize) -> usize {
        match b {
            0..=4 => 32,
            5..=16 => 64,
            17..=64 => 128,
            _ => DECODE_PARTITION,
        }
    }

    /// Blocks per thread-block cluster of [`CudaKernels::decode_fused_into`] for `b` decode
    /// sequences of GQA group `g` in `splits` partitions: [`DECODE_CLUSTER`] (groups 1-2, up to
    /// 4 rows) or 8 for batches of up to [`CLUSTER_MAX_ROWS`] on sm_90+ when it divides `splits`
    /// (a cluster merges its partitions in shared memory, and covers a context of up to 128
    /// tokens a block alone), else 1 (partials merged through global memory). Group 8 runs as
    /// group 4 with `LaunchOptions::gqa8_split` ([`CudaKernels::fused_group`]).
    pub fn decode_cluster(&self, b: usize, g: usize, splits: usize) -> usize {
        let c = match (self.fused_group(g).0, Self::cluster_of(b)) {
            (1 | 2, c) => c,
            (4, _) => 8,
            _ => return 1,
        };
        if self.clusters && b <= CLUSTER_MAX_ROWS && splits.is_multiple_of(c) {
            c
        } else {
            1
        }
    }

    /// `splits` partitions for `b` decode sequences rounded up to what
    /// [`CudaKernels::decode_cluster`] takes (partitions past a context cost a block that
    /// exits at once). Eager steps and graphs then cut a context one cluster covers alike.
    pub fn cluster_splits(&self, b: usize, splits: usize) -> usize {
        if self.clusters && b <= CLUSTER_MAX_ROWS {
            splits.max(1).next_multiple_of(Self::cluster_of(b))
        } else {
            splits
        }
    }

    /// The GQA group the fused decode attention runs GQA group `g` as, and the log2 of the
    /// grid's KV heads per cache KV head: group 8 as two group-4 halves a KV head with
    /// `LaunchOptions::gqa8_split` (each half reads the head's K/V; the two merge in clusters,
    /// where group 8's partials could only merge through global memory), else `g` itself.
    pub fn fused_group(&self, g: usize) -> (usize, u32) {
        if g == 8 && self.gqa8_split {
            (4, 1)
        } else {
            (g, 0)
        }
    }

    /// The cluster size for `b` decode sequences of GQA group 1-2: [`DECODE_CLUSTER`] (16)
    /// up to 4 rows, where a step has few blocks; 8 above, where clusters of 16 are hard to
    /// place (on the H200 they made attention at batch 8 1.6x slower than clusters of 8).
    fn cluster_of(b: usize) -> usize {
        if b <= 4 { DECODE_CLUSTER } else { 8 }
    }

    /// Partitions of flash-decoding for block tables `w` blocks wide (one per `part` tokens
    /// of the widest table).
    pub fn decode_splits(w: usize, block_size: usize, part: usize) -> usize {
        (w * block_size).div_ceil(part.max(1)).max(1)
    }

    /// The decode attention partitions of a step of `b` decode rows over block tables `width`
    /// blocks wide: as many partitions of [`CudaKernels::decode_partition`] tokens as the width
    /// needs, at most the graph bucket's count (`batch::graph_splits`) on a graph (`graph`)
    /// and, with `LaunchOptions::eager_graph_splits`, on an eager step too; in whole clusters
    /// ([`CudaKernels::cluster_splits`]). Graph capture and eager steps both count here, so a
    /// step and the bucket replaying it cut a context alike.
    pub fn step_splits(&self, b: usize, width: usize, block_size: usize, graph: bool) -> usize {
        let mut s = Self::decode_splits(width, block_size, Self::decode_partition(b));
        if graph || self.eager_graph_splits {
            s = s.min(crate::engine::batch::graph_splits(b, self.graph_splits));
        }
        self.cluster_splits(b, s)
    }

    /// [`CudaKernels::paged_decode`] writing into `out` (a contiguous `[B, nh * 128]` view) in
    /// `splits` partitions of at least `part` tokens, with partials in `scratch` (from
    /// [`CudaKernels::decode_scratch`] for at least `B` sequences and `splits`). Each
    /// sequence's partitions cover its context (they grow past `part` tokens when `splits` is
    /// too few). With `width`
    /// (u32 `[1]` on the device) the tables' row width is read from there, not from
    /// `block_tables`' shape: a captured graph then serves tables of any width.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_decode_into(
        &self,
        q: &Tensor,
        kv: KvRef<'_>,
        tables: (&Tensor, Option<&Tensor>),
        ctx_lens: &Tensor,
        block_size: usize,
        out: &Tensor,
        (splits, part, scratch): (usize, usize, Option<&(Tensor, Tensor)>),
    ) -> Result<()> {
        let (b, nh, _) = q.dims3()?;
        let nkv = kv.k.dim(0)?;
        let (funcs, smem) = if kv.is_fp8() {
            self.fp8_kernels("paged_decode")?.decode.chosen()
        } else {
            self.decode.chosen()
        };
        let func = match nh / nkv.max(1) {
            1 => &funcs[0],
            2 => &funcs[1],
            4 => &funcs[2],
            8 => &funcs[3],
            g => return Err(kernel_err("paged_decode", format!("GQA group {g}"))),
        };
        let splits = splits.max(1);
        let what = "paged_decode";
        let params = self.decode_params(
            q,
            kv,
            tables,
            ctx_lens,
            block_size,
            out,
            (splits, part, scratch),
            what,
        )?;
        let mut lb = self.launcher(func);
        lb.arg(&params);
        // SAFETY: `DecodeParams` is the kernel's one parameter (same layout, checked at
        // compile time on both sides); buffers are sized by `decode_params`.
        let cfg = LaunchConfig {
            shared_mem_bytes: smem,
            ..decode_grid(b, nkv, splits)
        };
        unsafe { lb.launch(cfg) }.w()?;
        if splits > 1 {
            let part32 = part as i32;
            let p = &params;
            let (pa, pm, pc, po, s32) = (p.part_acc, p.part_ml, p.ctx_lens, p.out, splits as i32);
            let mut rb = self.launcher(&self.decode_reduce);
            rb.arg(&pa)
                .arg(&pm)
                .arg(&pc)
                .arg(&po)
                .arg(&s32)
                .arg(&part32);
            // SAFETY: as above.
            unsafe { rb.launch(reduce_grid(b, nh)) }.w()?;
        }
        Ok(())
    }

    /// The parameters of a decode-attention launch (`paged_decode_g*`, `paged_verify_g*`)
    /// after checking the shapes: q `[B, nh, 128]`, caches `[nkv, slots, 128]`, `out`, and
    /// the partial buffers for `splits` partitions.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decode_params(
        &self,
        q: &Tensor,
        kv: KvRef<'_>,
        (block_tables, width): (&Tensor, Option<&Tensor>),
        ctx_lens: &Tensor,
        block_size: usize,
        out: &Tensor,
        (splits, part, scratch): (usize, usize, Option<&(Tensor, Tensor)>),
        what: &str,
    ) -> Result<DecodeParams> {
        self.check_dtype(q)?;
        let (k_cache, v_cache) = (kv.k, kv.v);
        let (b, nh, hd) = q.dims3()?;
        let (nkv, num_slots, _) = k_cache.dims3()?;
        let w = block_tables.elem_count() / b.max(1);
        if hd != 128 || nkv == 0 || nh % nkv != 0 {
            return Err(kernel_err(what, format!("nh {nh} nkv {nkv} hd {hd}")));
        }
        let (acc, ml) = partials(out, scratch, b * nh * splits * hd, splits, what)?;
        Ok(DecodeParams {
            q: self.ptr(q)?,
            k_cache: self.ptr(k_cache)?,
            v_cache: self.ptr(v_cache)?,
            block_tables: self.ptr(block_tables)?,
            ctx_lens: self.ptr(ctx_lens)?,
            out: self.ptr(out)?,
            part_acc: self.ptr(&acc)?,
            part_ml: self.ptr(&ml)?,
            geometry: DecodeGeometry::new(
                self,
                (w, width),
                block_size,
                num_slots,
                nkv,
                part,
                kv.scale,
            )?,
        })
    }

    /// Zeroed merge counters for [`CudaKernels::decode_fused_into`]: one per sequence and
    /// head for up to `rows` sequences of `nh` heads (each launch leaves them zero again).
    pub fn decode_counters(&self, rows: usize, nh: usize) -> Result<Tensor> {
        Ok(Tensor::zeros(
            (rows * nh).max(1),
            DType::U32,
            &candle_core::Device::Cuda(self.device.clone()),
        )?)
    }

    /// A decode step's attention for one layer in one launch: from the qkv matmul's output
    /// `qkv` `[B, (nh + 2 nkv) * 128]`, the q/k RMSNorm (`q_w` pre-scaled by 1/sqrt(128)) and
    /// RoPE at `positions`, the new K/V rows written to `slots` (`u32::MAX`: none), paged
    /// attention over the context and the merge of its partitions, into `out` `[B, nh * 128]`.
    /// The same bits as [`CudaKernels::qk_norm_rope_kv_write_into`] followed by
    /// [`CudaKernels::paged_decode_into`]. `counters` is from
    /// [`CudaKernels::decode_counters`] for at least `B` sequences; the rest as
    /// [`CudaKernels::paged_decode_into`]. `short`: every context fits one cluster
    /// ([`CudaKernels::fused_short_context`]), so the tensor-core kernels of
    /// `LaunchOptions::fused_mma` may run (steps of up to `fused_mma_rows` rows); else the
    /// CUDA-core ones. The tensor-core kernels have no other loop: a context past one cluster
    /// in a launch said to be `short` faults the device (`kernels/fused_decode.cu`).
    #[allow(clippy::too_many_arguments)]
    pub fn decode_fused_into(
        &self,
        qkv: &Tensor,
        norms: (&Tensor, &Tensor, f64),
        inv_freq: &Tensor,
        pos_slots: (&Tensor, &Tensor),
        caches: KvRef<'_>,
        tables: (&Tensor, Option<&Tensor>),
        ctx_lens: &Tensor,
        block_size: usize,
        out: &Tensor,
        parts: (usize, usize, Option<&(Tensor, Tensor)>, &Tensor),
        short: bool,
    ) -> Result<()> {
        self.decode_fused_stage_into(
            qkv, norms, inv_freq, pos_slots, caches, tables, ctx_lens, block_size, out, parts,
            short, 0,
        )
    }

    /// Profiling only: [`CudaKernels::decode_fused_into`] with every block ending after phase
    /// `stop` of `kernels/fused_decode.cu`'s `decode_fused` (1: the K/V prefetch and the wait;
    /// 2: q/k norm + RoPE; 3: the attention loop; 4: the block's partial formed; 0: the
    /// whole kernel; -1: the whole kernel without clusters). Only `stop` 0 and -1 leave valid
    /// outputs and merge counters.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn decode_fused_stage_into(
        &self,
        qkv: &Tensor,
        (q_w, k_w, eps): (&Tensor, &Tensor, f64),
        inv_freq: &Tensor,
        (positions, slots): (&Tensor, &Tensor),
        kv: KvRef<'_>,
        (block_tables, width): (&Tensor, Option<&Tensor>),
        ctx_lens: &Tensor,
        block_size: usize,
        out: &Tensor,
        (splits, part, scratch, counters): (usize, usize, Option<&(Tensor, Tensor)>, &Tensor),
        short: bool,
        stop: i32,
    ) -> Result<()> {
        self.check_dtype(qkv)?;
        let (k_cache, v_cache) = (kv.k, kv.v);
        let (nkv, num_slots, hd) = k_cache.dims3()?;
        let b = ctx_lens.elem_count();
        let nh = out.elem_count() / (b * hd).max(1);
        if !self.fused_decode_serves(nh, nkv, hd)
            || qkv.elem_count() != b * (nh + 2 * nkv) * hd
            || out.elem_count() != b * nh * hd
            || counters.elem_count() < b * (nkv << self.fused_group(nh / nkv.max(1)).1)
        {
            return Err(kernel_err(
                "decode_fused",
                format!("nh {nh} nkv {nkv} hd {hd} rows {b}"),
            ));
        }
        let loaded = if kv.is_fp8() {
            self.fp8_kernels("decode_fused")?.decode_fused.as_ref()
        } else {
            self.decode_fused.as_ref()
        };
        let Some(fused) = loaded else {
            return Err(kernel_err("decode_fused", "not loaded"));
        };
        // Group 8 may run as group 4 over twice the KV heads (`fused_group`).
        let (g, kv_shift) = self.fused_group(nh / nkv);
        // Clusters only for the whole kernel (not a profiling stop); the tensor-core kernels
        // only in clusters.
        let cluster = if stop == 0 {
            self.decode_cluster(b, nh / nkv, splits.max(1))
        } else {
            1
        };
        let (funcs, smem) = fused.chosen(b, short && cluster > 1);
        let func = &funcs[g.trailing_zeros() as usize];
        let nkv_grid = nkv << kv_shift;
        let splits = splits.max(1);
        let (acc, ml) = partials(out, scratch, b * nh * splits * hd, splits, "decode_fused")?;
        let w = block_tables.elem_count() / b.max(1);
        let params = FusedDecodeParams {
            qkv: self.ptr(qkv)?,
            q_w: self.ptr(q_w)?,
            k_w: self.ptr(k_w)?,
            inv_freq: self.ptr(inv_freq)?,
            pos: self.ptr(positions)?,
            slots: self.ptr(slots)?,
            k_cache: self.ptr(k_cache)?,
            v_cache: self.ptr(v_cache)?,
            block_tables: self.ptr(block_tables)?,
            ctx_lens: self.ptr(ctx_lens)?,
            out: self.ptr(out)?,
            part_acc: self.ptr(&acc)?,
            part_ml: self.ptr(&ml)?,
            counters: self.ptr(counters)?,
            geometry: DecodeGeometry::new(
                self,
                (w, width),
                block_size,
                num_slots,
                nkv_grid,
                part,
                kv.scale,
            )?,
            eps: eps as f32,
            stop,
            kv_shift: kv_shift as i32,
            pad: 0,
        };
        let mut lb = self.launcher(func);
        if stop == 0 {
            lb.cluster_z(cluster as u32);
        }
        lb.arg(&params);
        // SAFETY: `FusedDecodeParams` is the kernel's one parameter (same layout, checked at
        // compile time on both sides); the buffers are sized above.
        let cfg = LaunchConfig {
            shared_mem_bytes: smem,
            ..decode_grid(b, nkv_grid, splits)
        };
        unsafe { lb.launch(cfg) }.w()?;
        Ok(())
    }
}

/// The partial buffers of a decode launch in `splits` partitions: the scratch when there are
/// several (it must hold `need` accumulators), `out` (unused by the kernel) for one.
fn partials(
    out: &Tensor,
    scratch: Option<&(Tensor, Tensor)>,
    need: usize,
    splits: usize,
    what: &str,
) -> Result<(Tensor, Tensor)> {
    match scratch {
        _ if splits == 1 => Ok((out.clone(), out.clone())),
        Some((a, m)) if a.elem_count() >= need => Ok((a.clone(), m.clone())),
        _ => Err(kernel_err(what, "scratch missing or too small")),
    }
}

/// Grid (sequences, heads) of 128 threads: the merge of a decode launch's partitions.
pub(super) fn reduce_grid(b: usize, nh: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (b as u32, nh as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Grid (sequences, KV heads, partitions) of 128 threads: the decode kernels' launch.
pub(super) fn decode_grid(b: usize, nkv: usize, splits: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (b as u32, nkv as u32, splits as u32),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}
