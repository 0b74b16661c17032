//! The fused decode attention's launch parameters, and its launch with the layer's add +
//! RMSNorm + qkv matmul inside (`LaunchOptions::attn_qkv`, `kernels/fused_qkv.cuh`).

use candle_core::Tensor;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;

use super::attention::{decode_grid, partials};
use super::attention_handles::{ATTN_QKV_MAX_SMEM, FusedDecode};
use super::kernels::CudaKernels;
use super::launch::kernel_err;
use super::params::{DecodeGeometry, FusedDecodeParams, FusedQkvParams};
use crate::engine::kv_format::KvRef;
use crate::error::Result;

/// The qkv phase's inputs: the residual row, the delta added to it and where the sum goes;
/// the norm's weight and eps; the qkv weight.
pub type QkvInput<'a> = (
    (&'a Tensor, Option<&'a Tensor>, &'a Tensor),
    (&'a Tensor, f64),
    &'a Tensor,
);

/// Rows a block of the qkv phase sums, in clusters of 16 (`QRB` of
/// `kernels/fused_qkv.cuh`), and the most inputs a row (its norm's `NORM_E` a thread).
const QKV_ROWS_A_BLOCK: usize = 32;
const QKV_MAX_K: usize = 2048;

/// Bytes of the cluster merge's partials of a block (16 blocks x 2 heads x 128 f32).
const MERGE_PARTIALS: usize = 16 * 2 * 128 * 4;

/// A qkv-phase launch's dynamic shared memory after the attention's own `base` bytes, for
/// rows of `k` inputs of which the first `reg_k` are in registers: (where the rows' other
/// inputs go, the normed row, the merge's partials, the total). The partials reuse the rows'
/// space when it is large enough.
fn qkv_layout(base: usize, k: usize, reg_k: usize) -> (usize, usize, usize, usize) {
    let rows = QKV_ROWS_A_BLOCK * (k - reg_k) * 2;
    let x = base + rows;
    let end = x + k * 2;
    if rows >= MERGE_PARTIALS {
        (base, x, base, end)
    } else {
        let pa = end.next_multiple_of(16);
        (base, x, pa, pa + MERGE_PARTIALS)
    }
}

/// How a layer's qkv-phase launches run: the norm's scale deferred (as the skinny matmul's),
/// and the stages a warp of the tensor-core loop.
#[derive(Clone, Copy)]
struct QkvPlan {
    deferred: bool,
    short_stages: u8,
}

impl CudaKernels {
    /// Whether [`CudaKernels::decode_fused_qkv_into`] serves a 1-row step of a layer of `nh`
    /// query heads over `nkv` KV heads of `hd` dims whose qkv weight is `[n, k]`, in `splits`
    /// partitions whose contexts fit one cluster (the tensor-core loop; `short` of
    /// [`CudaKernels::decode_fused_into`]): its kernels are loaded (`LaunchOptions::attn_qkv`),
    /// GQA group 2, clusters of 16 blocks, rows of 1,024-2,048 inputs (a multiple of 256), the
    /// skinny matmuls' norm kernels in shared memory (whose bits it gives: `Some(true)` when
    /// their norm's scale is deferred, `Some(false)` when not), and the GPU holding a cluster
    /// a KV head at once (two blocks an SM: cuOccupancyMaxActiveClusters). None: the step
    /// takes the qkv matmul's launch.
    pub fn attn_qkv_serves(
        &self,
        shape: (usize, usize, usize),
        w: (usize, usize),
        splits: usize,
    ) -> Option<bool> {
        self.qkv_plan(shape, w, splits).map(|p| p.deferred)
    }

    /// [`CudaKernels::attn_qkv_serves`]'s plan: the 1-row graphs' stages if that kernel fits,
    /// else one stage.
    fn qkv_plan(
        &self,
        (nh, nkv, hd): (usize, usize, usize),
        (n, k): (usize, usize),
        splits: usize,
    ) -> Option<QkvPlan> {
        let fused = self.decode_fused.as_ref()?;
        let gemv = self.gemv.as_ref()?;
        let reg_k = fused.qkv.as_ref()?.1;
        if !self.fused_decode_serves(nh, nkv, hd)
            || self.fused_group(nh / nkv) != (2, 0)
            || n != (nh + 2 * nkv) * hd
            || !(reg_k.max(256)..=QKV_MAX_K).contains(&k)
            || !k.is_multiple_of(256)
            || !gemv.norm_smem
            || self.decode_cluster(1, 2, splits.max(1)) != 16
        {
            return None;
        }
        let deferred = matches!(&gemv.deferred, Some((max_k, _)) if k <= *max_k);
        let fits = |stages: u8| -> bool {
            let Some((func, base)) = fused.qkv_kernel(stages, deferred) else {
                return false;
            };
            let smem = qkv_layout(base as usize, k, reg_k).3;
            if smem > ATTN_QKV_MAX_SMEM as usize {
                return false;
            }
            let smem = smem as u32;
            let mut known = fused.qkv_fit.lock();
            if let Some(&(.., f)) = known
                .iter()
                .find(|e| (e.0, e.1, e.2) == (stages, smem, nkv))
            {
                return f;
            }
            let cfg = LaunchConfig {
                shared_mem_bytes: smem,
                ..decode_grid(1, nkv, 16)
            };
            let most = super::launch::max_active_clusters(func, cfg, 16);
            let f = most.is_some_and(|m| m >= nkv as i32);
            tracing::info!(
                "attn_qkv: {stages}-stage kernel, {smem} B of shared memory a block: {most:?} \
                 clusters of 16 at once for {nkv} KV heads{}",
                if f { "" } else { ": not taken" }
            );
            known.push((stages, smem, nkv, f));
            f
        };
        let pref = fused.stages_one();
        let short_stages = [pref, 1]
            .into_iter()
            .filter(|&d| d > 0 && d <= pref)
            .find(|&d| fits(d))?;
        Some(QkvPlan {
            deferred,
            short_stages,
        })
    }

    /// [`CudaKernels::decode_fused_into`] for one row with the layer's add + RMSNorm + qkv
    /// matmul inside (`LaunchOptions::attn_qkv`, `kernels/fused_qkv.cuh`): `res` (+ `delta`,
    /// the sum written to `res_out`, as [`CudaKernels::norm_linear_into`] does) normed by
    /// `norm_w` and multiplied by `qkv_w` `[(nh + 2 nkv) * 128, k]` within the attention's
    /// clusters; the same bits as `norm_linear_into` followed by `decode_fused_into`, with no
    /// qkv output written. Only where [`CudaKernels::attn_qkv_serves`] says so.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_fused_qkv_into(
        &self,
        ((res, delta, res_out), (norm_w, norm_eps), qkv_w): QkvInput<'_>,
        norms: (&Tensor, &Tensor, f64),
        inv_freq: &Tensor,
        pos_slots: (&Tensor, &Tensor),
        kv: KvRef<'_>,
        tables: (&Tensor, Option<&Tensor>),
        ctx_lens: &Tensor,
        block_size: usize,
        out: &Tensor,
        parts: (usize, usize, Option<&(Tensor, Tensor)>, &Tensor),
        short: bool,
    ) -> Result<()> {
        let what = "decode_fused_qkv";
        let (n, k) = qkv_w.dims2()?;
        let (nkv, _, hd) = kv.k.dims3()?;
        let nh = out.elem_count() / hd.max(1);
        let plan = self
            .qkv_plan((nh, nkv, hd), (n, k), parts.0)
            .filter(|_| ctx_lens.elem_count() == 1 && !kv.is_fp8() && short)
            .ok_or_else(|| kernel_err(what, format!("not served: nh {nh} nkv {nkv} [{n}, {k}]")))?;
        for x in [res, res_out, norm_w].into_iter().chain(delta) {
            self.check_dtype(x)?;
            if x.elem_count() != k {
                return Err(kernel_err(
                    what,
                    "residual, delta and norm must hold one row of k",
                ));
            }
        }
        let (l, fused) = self.fused_launch(
            (qkv_w, 1),
            norms,
            inv_freq,
            pos_slots,
            kv,
            tables,
            ctx_lens,
            block_size,
            out,
            parts,
            0,
        )?;
        let (func, base) = fused
            .qkv_kernel(plan.short_stages, plan.deferred)
            .ok_or_else(|| kernel_err(what, "not loaded"))?;
        let reg_k = fused.qkv.as_ref().map_or(0, |q| q.1);
        let (w_off, x_off, pa_off, smem) = qkv_layout(base as usize, k, reg_k);
        let q = FusedQkvParams {
            w: self.ptr(qkv_w)?,
            res: self.ptr(res)?,
            delta: self.ptr(delta.unwrap_or(res))?,
            res_out: self.ptr(res_out)?,
            nw: self.ptr(norm_w)?,
            eps: norm_eps as f32,
            add: i32::from(delta.is_some()),
            k: k as i32,
            w_off: w_off as i32,
            x_off: x_off as i32,
            pa_off: pa_off as i32,
        };
        let mut lb = self.launcher(func);
        lb.cluster_z(l.cluster as u32);
        lb.arg(&l.params).arg(&q);
        let cfg = LaunchConfig {
            shared_mem_bytes: smem as u32,
            ..l.grid
        };
        // SAFETY: the two parameters are the kernel's (`FusedDecodeParams`, `FusedQkvParams`:
        // layouts checked at compile time on both sides); the buffers are sized above and in
        // `fused_launch`; res and res_out are different buffers (the forward's ping-pong).
        unsafe { lb.launch(cfg) }.w()?;
        Ok(())
    }

    /// The checked parameters of a fused decode launch (see
    /// [`CudaKernels::decode_fused_stage_into`]) and the kernel set of the caches' dtype. `qkv`
    /// is the qkv matmul's output, or with `.1` 1 the qkv weight of
    /// [`CudaKernels::decode_fused_qkv_into`] (read by the kernel only through its second
    /// parameter; `.1` 3 checks an output's size).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused_launch(
        &self,
        (qkv, what): (&Tensor, u8),
        (q_w, k_w, eps): (&Tensor, &Tensor, f64),
        inv_freq: &Tensor,
        (positions, slots): (&Tensor, &Tensor),
        kv: KvRef<'_>,
        (block_tables, width): (&Tensor, Option<&Tensor>),
        ctx_lens: &Tensor,
        block_size: usize,
        out: &Tensor,
        (splits, part, scratch, counters): (usize, usize, Option<&(Tensor, Tensor)>, &Tensor),
        stop: i32,
    ) -> Result<(FusedLaunch, &FusedDecode)> {
        self.check_dtype(qkv)?;
        let (k_cache, v_cache) = (kv.k, kv.v);
        let (nkv, num_slots, hd) = k_cache.dims3()?;
        let b = ctx_lens.elem_count();
        let nh = out.elem_count() / (b * hd).max(1);
        if !self.fused_decode_serves(nh, nkv, hd)
            || (what == 3 && qkv.elem_count() != b * (nh + 2 * nkv) * hd)
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
        let launch = FusedLaunch {
            params,
            rows: b,
            group: g,
            cluster: self.decode_cluster(b, nh / nkv, splits),
            grid: decode_grid(b, nkv_grid, splits),
        };
        Ok((launch, fused))
    }
}

/// A fused decode launch's checked parameter, shape and grid ([`CudaKernels::fused_launch`]).
pub(super) struct FusedLaunch {
    pub(super) params: FusedDecodeParams,
    pub(super) rows: usize,
    /// The GQA group the kernel runs.
    pub(super) group: usize,
    /// Blocks per cluster along the partitions.
    pub(super) cluster: usize,
    pub(super) grid: LaunchConfig,
}
