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

/// Most qkv rows a block of the qkv phase sums (`QKV_MAX_RB` of `kernels/fused_qkv.cuh`).
const QKV_MAX_ROWS_A_BLOCK: usize = 64;

impl CudaKernels {
    /// Whether [`CudaKernels::decode_fused_qkv_into`] serves a 1-row step of a layer of `nh`
    /// query heads over `nkv` KV heads of `hd` dims whose qkv weight is `[n, k]`, in `splits`
    /// partitions: its kernels are loaded (`LaunchOptions::attn_qkv`), GQA group 2, clusters
    /// of at least 8 blocks, the skinny matmuls' norm kernels in shared memory (whose bits it
    /// gives: `Some(true)` when their norm's scale is deferred, `Some(false)` when not), the
    /// block's weight rows within `ATTN_QKV_MAX_SMEM`, and one cluster a KV head fitting the
    /// GPU at once. None: the step takes the qkv matmul's launch.
    pub fn attn_qkv_serves(
        &self,
        (nh, nkv, hd): (usize, usize, usize),
        (n, k): (usize, usize),
        splits: usize,
    ) -> Option<bool> {
        let fused = self.decode_fused.as_ref()?;
        let gemv = self.gemv.as_ref()?;
        fused.qkv.as_ref()?;
        if !self.fused_decode_serves(nh, nkv, hd)
            || self.fused_group(nh / nkv) != (2, 0)
            || n != (nh + 2 * nkv) * hd
            || !k.is_multiple_of(8)
            || !gemv.norm_smem
        {
            return None;
        }
        let deferred = matches!(&gemv.deferred, Some((max_k, _)) if k <= *max_k);
        let c = self.decode_cluster(1, 2, splits.max(1));
        let rb = (4 * hd).checked_div(c)?;
        if c < 8 || (4 * hd) % c != 0 || rb > QKV_MAX_ROWS_A_BLOCK || rb % 8 != 0 {
            return None;
        }
        // The most dynamic shared memory a launch takes: the tensor-core loop's, if any.
        let (func, base) = fused.qkv_chosen(true, deferred)?;
        let smem = base as usize + (rb + 1) * k * 2;
        if smem > ATTN_QKV_MAX_SMEM as usize {
            return None;
        }
        let smem = smem as u32;
        let mut fits = fused.qkv_fit.lock();
        let fit = match fits.iter().find(|(s, cl, _)| *s == smem && *cl == c) {
            Some(&(_, _, f)) => f,
            None => {
                let cfg = LaunchConfig {
                    shared_mem_bytes: smem,
                    ..decode_grid(1, nkv, c)
                };
                let most = super::launch::max_active_clusters(func, cfg, c as u32);
                let f = most.is_some_and(|m| m >= nkv as i32);
                tracing::info!(
                    "attn_qkv: clusters of {c} blocks with {smem} B of shared memory each: \
                     {most:?} at once for {nkv} KV heads: {}",
                    if f {
                        "served"
                    } else {
                        "not served (the qkv matmul launches)"
                    }
                );
                fits.push((smem, c, f));
                f
            }
        };
        fit.then_some(deferred)
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
        let deferred = self
            .attn_qkv_serves((nh, nkv, hd), (n, k), parts.0)
            .filter(|_| ctx_lens.elem_count() == 1 && !kv.is_fp8())
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
            .qkv_chosen(short, deferred)
            .ok_or_else(|| kernel_err(what, "not loaded"))?;
        let rb = 4 * hd / l.cluster;
        let q = FusedQkvParams {
            w: self.ptr(qkv_w)?,
            res: self.ptr(res)?,
            delta: self.ptr(delta.unwrap_or(res))?,
            res_out: self.ptr(res_out)?,
            nw: self.ptr(norm_w)?,
            eps: norm_eps as f32,
            add: i32::from(delta.is_some()),
            k: k as i32,
            w_off: base as i32,
        };
        let mut lb = self.launcher(func);
        lb.cluster_z(l.cluster as u32);
        lb.arg(&l.params).arg(&q);
        let cfg = LaunchConfig {
            shared_mem_bytes: base + ((rb + 1) * k * 2) as u32,
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
