//! The 1-row fused decode attention with the layer's add + RMSNorm + qkv matmul inside
//! (`kernels/fused_qkv.cu`, `LaunchOptions::fused_qkv`): each KV head's cluster forms that
//! head's qkv rows itself, so a layer of a 1-row step has one launch and one dependent wait
//! fewer. The same bits as [`CudaKernels::norm_linear_into`] (the skinny matmul's norm kernel)
//! followed by [`CudaKernels::decode_fused_into`].

use candle_core::Tensor;

use super::attention::DECODE_CLUSTER;
use super::attention_handles::FUSED_QKV_MAX_K;
use super::kernels::CudaKernels;
use super::launch::kernel_err;
use super::params::QkvIn;
use crate::engine::kv_format::KvRef;
use crate::error::Result;

impl CudaKernels {
    /// Whether [`CudaKernels::decode_fused_qkv_into`] serves a step of `rows` rows of a layer
    /// of `nh` / `nkv` heads of `hd` over inputs of `k` (the hidden size), caches in fp8 or
    /// not: one row, GQA group 2, head_dim 128, `k` a multiple of 8 up to 2,048, the kernel
    /// loaded (`LaunchOptions::fused_qkv`, sm_90), the skinny matmuls on with block-wide norms
    /// (whose bits it forms; not `warp_norm`), and clusters of 16 (`decode_cluster`). The step
    /// must also be `short` (its context within one cluster), as for the tensor-core kernels.
    pub fn fused_qkv_serves(
        &self,
        rows: usize,
        (nh, nkv, hd): (usize, usize, usize),
        k: usize,
        fp8: bool,
    ) -> bool {
        let fused = if fp8 {
            self.fp8_kernels("decode_fused_qkv")
                .ok()
                .and_then(|f| f.decode_fused.as_ref())
        } else {
            self.decode_fused.as_ref()
        };
        rows == 1
            && fused.is_some_and(|f| f.qkv.is_some())
            && nh == 2 * nkv
            && hd == 128
            && self.fused_decode_serves(nh, nkv, hd)
            && k.is_multiple_of(8)
            && k <= FUSED_QKV_MAX_K
            && self.gemv.as_ref().is_some_and(|s| s.norm_smem)
            && self.decode_cluster(1, 2, DECODE_CLUSTER) == DECODE_CLUSTER
    }

    /// [`CudaKernels::norm_linear_into`] of the qkv matmul (`res`, `delta`, `res_out` one row
    /// each; `norm_w`, `eps` the layer's input norm; `qkv_w` `[(nh + 2 nkv) * 128, k]`)
    /// followed by [`CudaKernels::decode_fused_into`] of a `short` 1-row step, in one launch:
    /// the qkv rows never leave the kernel (no qkv buffer), `res_out` is written as the norm
    /// kernel writes it, and the attention output, the new K/V rows and the counters are as
    /// `decode_fused_into` leaves them (the same bits). The attention runs in 16 partitions (one
    /// cluster a KV head; `parts.0` must be a multiple of 16). An error when
    /// [`CudaKernels::fused_qkv_serves`] does not hold for the step's shape.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_fused_qkv_into(
        &self,
        (res, delta, res_out): (&Tensor, Option<&Tensor>, &Tensor),
        (norm_w, norm_eps): (&Tensor, f64),
        qkv_w: &Tensor,
        norms: (&Tensor, &Tensor, f64),
        inv_freq: &Tensor,
        pos_slots: (&Tensor, &Tensor),
        kv: KvRef<'_>,
        tables: (&Tensor, Option<&Tensor>),
        ctx_lens: &Tensor,
        block_size: usize,
        out: &Tensor,
        parts: (usize, usize, Option<&(Tensor, Tensor)>, &Tensor),
    ) -> Result<()> {
        let (nkv, _, hd) = kv.k.dims3()?;
        let (n_w, k) = qkv_w.dims2()?;
        let nh = n_w / hd.max(1) - 2 * nkv;
        let rows = ctx_lens.elem_count();
        if !self.fused_qkv_serves(rows, (nh, nkv, hd), k, kv.is_fp8())
            || res.elem_count() != k
            || res_out.elem_count() != k
            || norm_w.elem_count() != k
            || delta.is_some_and(|d| d.elem_count() != k)
        {
            return Err(kernel_err(
                "decode_fused_qkv",
                format!("rows {rows} nh {nh} nkv {nkv} hd {hd} k {k}: not served"),
            ));
        }
        for x in [res, res_out, norm_w, qkv_w] {
            self.check_dtype(x)?;
        }
        // The norm's scale on the sums where the skinny matmul's norm kernel defers it.
        let deferred = self
            .gemv
            .as_ref()
            .and_then(|s| s.deferred.as_ref())
            .is_some_and(|(max_k, _)| k <= *max_k);
        let qin = QkvIn {
            w: self.ptr(qkv_w)?,
            res: self.ptr(res)?,
            delta: self.ptr(delta.unwrap_or(res))?,
            res_out: self.ptr(res_out)?,
            nw: self.ptr(norm_w)?,
            eps: norm_eps as f32,
            k: k as i32,
            add: delta.is_some() as i32,
            deferred: deferred as i32,
        };
        self.fused_launch(
            None,
            norms,
            inv_freq,
            pos_slots,
            kv,
            tables,
            ctx_lens,
            block_size,
            out,
            parts,
            (true, 0),
            Some(qin),
        )
    }
}
