//! The forward's matmuls, written into buffers the caller owns (candle's matmul allocates its
//! output, which a captured graph must not do): the skinny-matmul kernels of
//! `kernels/gemv.cu` for decode steps of up to [`GEMV_MAX_ROWS`] rows (bf16; CUDA cores) and,
//! with `LaunchOptions::gemv_mma`, up to [`GEMV_MMA_MAX_ROWS`] (tensor cores,
//! `kernels/gemv_mma.cu`), cuBLAS otherwise. A skinny matmul can prefetch the weights of the
//! matmul after it into L2 (`next`, with `LaunchOptions::l2_prefetch`).
//!
//! Invariant: the handle runs on the kernels' stream with a workspace of its own, allocated
//! once, so a matmul inside graph capture allocates nothing.

use std::ffi::c_void;

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::cublas::{result as blas, sys};
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, LaunchConfig};
use candle_core::{DType, Tensor};

use super::handles::{GEMV_WARPS, STREAM_NORM_MAX_K};
use super::kernels::{CudaKernels, GEMV_MAX_ROWS, GEMV_MMA_MAX_ROWS};
use super::launch::kernel_err;
use crate::error::Result;

/// Output rows of one block of the tensor-core kernels (one MMA's 16).
pub(super) const GEMV_MMA_ROWS: usize = 16;

/// A skinny-matmul kernel and the output rows one of its blocks takes.
struct Gemv<'a> {
    f: &'a CudaFunction,
    rows_per_block: usize,
    /// Whether its norm variant holds the normed rows in shared memory (T * K bf16).
    norm_smem: bool,
    /// The most blocks its grid takes (streamed rows: each warp takes every G-th row).
    max_blocks: Option<usize>,
    /// Dynamic shared memory a block takes before its normed rows (staged weights).
    stage_bytes: usize,
}

impl Gemv<'_> {
    /// The blocks of a launch over `n` output rows (or gate/up pairs).
    fn blocks(&self, n: usize) -> u32 {
        let b = n.div_ceil(self.rows_per_block);
        self.max_blocks.map_or(b, |m| b.min(m)) as u32
    }
}

/// Inputs a lane's one batch of weight loads covers (8 loads of 8 bf16, 32 lanes): rows longer
/// than this take the double-buffered kernels when they are loaded.
const DOUBLE_BUFFER_MIN_K: usize = 8 * 8 * 32;

/// A lane's loads in one batch (`BATCH` of `kernels/gemv.cuh`): the 1-row gate|up stages a
/// warp's second batch only where some warp has more slots than this.
const STAGE_MIN_SLOTS: usize = 8;

/// Widest weight (output rows) the skinny-matmul kernels take.
const GEMV_MAX_N: usize = 1 << 15;

/// Shared memory the fused-norm kernels may take for the normed rows (T * K bf16): 48 KiB (no
/// opt-in) less the tensor-core kernels' 8.25 KiB of static shared memory (at 8 rows over
/// 3,072 inputs they asked for 51 KB and failed to launch).
const NORM_SMEM: usize = 39 << 10;

/// Most rows a cuBLAS matmul takes on its row class's algorithm (`blas::Lt`): the largest
/// graph bucket an engine captures by default (`defaults::MAX_GRAPH_BATCH`). Prefill chunks
/// of up to this many tokens take it too (not measured apart on the H200).
const LT_MAX_ROWS: usize = 1024;

impl CudaKernels {
    /// `out = x · wᵀ` for x `[T, in]`, a weight `[out, in]` (a linear layer's layout) and
    /// out `[T, out]`, all contiguous and of the kernels' dtype (f32 accumulation).
    pub fn linear_into(&self, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
        self.linear_next_into(x, w, out, None)
    }

    /// [`Self::linear_into`], prefetching the weight `next` (the step's next matmul's) into
    /// L2 while it runs when a skinny-matmul kernel serves it and `l2_prefetch` is on.
    pub fn linear_next_into(
        &self,
        x: &Tensor,
        w: &Tensor,
        out: &Tensor,
        next: Option<&Tensor>,
    ) -> Result<()> {
        self.check_dtype(x)?;
        self.check_dtype(w)?;
        self.check_dtype(out)?;
        let (n_out, k) = w.dims2()?;
        let t = x.elem_count() / k.max(1);
        if x.dim(candle_core::D::Minus1)? != k || out.elem_count() != t * n_out {
            return Err(kernel_err(
                "linear",
                format!(
                    "x {:?} · w {:?}ᵀ does not fit out {:?}",
                    x.shape(),
                    w.shape(),
                    out.shape()
                ),
            ));
        }
        if t == 0 {
            return Ok(());
        }
        let (px, pw, po) = (self.ptr(x)?, self.ptr(w)?, self.ptr(out)?);
        // (The streamed kernel takes an lm_head too with `gemv_tma_head`.)
        if self.gemv_tma_into(t, (n_out, k), (pw, px, po))? {
            return Ok(());
        }
        // cuBLAS reads a wide matrix (lm_head) at least as fast (BENCHMARKS.md).
        if let Some(g) = self
            .gemv_for(0, t, (n_out, k))
            .filter(|_| n_out <= GEMV_MAX_N)
        {
            return self.launch_gemv(g, (pw, px, po), n_out, k, next);
        }
        let ty = match self.dtype {
            DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
            DType::F32 => sys::cudaDataType::CUDA_R_32F,
            other => return Err(kernel_err("linear", format!("dtype {other:?}"))),
        };
        // Steps of up to LT_MAX_ROWS rows: the algorithm of the row class (`blas::Lt`), so a
        // step and the graph bucket that replays it give every row the same bits.
        if self.blas_row_class && t <= LT_MAX_ROWS {
            let class = crate::engine::batch::row_class(t);
            let shape = (n_out, k, t, class);
            let ws = self.blas.workspace;
            if self
                .blas
                .lt
                .linear(&self.stream, ty, shape, (pw, px, po), ws)?
            {
                return Ok(());
            }
        }
        let (alpha, beta) = (1f32, 0f32);
        let (m, n, kk) = (n_out as i32, t as i32, k as i32);
        // Column-major view: outᵀ [out, T] = W [out, in] (the row-major weight read
        // transposed) · xᵀ [in, T].
        // SAFETY: the pointers are live device buffers of the sizes checked above, on the
        // handle's stream; alpha/beta are host f32 as CUBLAS_COMPUTE_32F wants.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle.handle(),
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                m,
                n,
                kk,
                (&alpha as *const f32).cast(),
                pw as *const c_void,
                ty,
                kk,
                px as *const c_void,
                ty,
                kk,
                (&beta as *const f32).cast(),
                po as *mut c_void,
                ty,
                m,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| kernel_err("linear (cuBLAS)", e))?;
        Ok(())
    }

    /// `act = silu(x · gateᵀ) * (x · upᵀ)` for a gate|up weight `[2I, in]` (gate rows first)
    /// and act `[T, I]`: one fused skinny-matmul launch for few rows, else a cuBLAS matmul
    /// into `gu` (`[T, 2I]`) and the SiLU*up kernel.
    pub fn gate_up_silu_into(
        &self,
        x: &Tensor,
        w: &Tensor,
        gu: &Tensor,
        act: &Tensor,
    ) -> Result<()> {
        let (two_i, k) = w.dims2()?;
        let t = x.elem_count() / k.max(1);
        let inter = two_i / 2;
        if let Some(g) = self.gemv_for(1, t, (two_i, k)) {
            self.check_dtype(x)?;
            self.check_dtype(w)?;
            self.check_dtype(act)?;
            if x.dim(candle_core::D::Minus1)? != k || act.elem_count() != t * inter {
                return Err(kernel_err("gate_up_silu", "shapes do not fit"));
            }
            let ptrs = (self.ptr(w)?, self.ptr(x)?, self.ptr(act)?);
            return self.launch_gemv(g, ptrs, inter, k, None);
        }
        self.linear_into(x, w, gu)?;
        self.silu_mul_into(gu, act)
    }

    /// `h = rmsnorm(res + delta) * norm_w` (the sum also written to `res_out`, a buffer other
    /// than `res`, when there is a delta), then `out = h · wᵀ`, or with `silu`
    /// (`Some((gu, act))`) the gate|up SiLU product into `act` (`out` unused). One launch for
    /// few rows (prefetching the weight `next` into L2 as [`Self::linear_next_into`] does);
    /// otherwise the add+RMSNorm kernel into `h`, then the matmul.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_linear_into(
        &self,
        (res, delta, res_out): (&Tensor, Option<&Tensor>, &Tensor),
        (norm_w, eps): (&Tensor, f64),
        h: &Tensor,
        w: &Tensor,
        out: &Tensor,
        silu: Option<(&Tensor, &Tensor)>,
        next: Option<&Tensor>,
    ) -> Result<()> {
        let (n_w, k) = w.dims2()?;
        let t = res.elem_count() / k.max(1);
        let kind = if silu.is_some() { 3 } else { 2 };
        let fused = self
            .gemv_for(kind, t, (n_w, k))
            .filter(|_| t * k * 2 <= NORM_SMEM && res.dim(candle_core::D::Minus1).ok() == Some(k));
        let Some(g) = fused else {
            self.add_rmsnorm_to(delta, res, res_out, norm_w, eps, h)?;
            return match silu {
                Some((gu, act)) => self.gate_up_silu_into(h, w, gu, act),
                None => self.linear_into(h, w, out),
            };
        };
        for x in [res, res_out, norm_w, w, out] {
            self.check_dtype(x)?;
        }
        let (dst, n) = match silu {
            Some((_, act)) => (act, n_w / 2),
            None => (out, n_w),
        };
        if dst.elem_count() != t * n || res_out.elem_count() != res.elem_count() {
            return Err(kernel_err("norm_linear", "shapes do not fit"));
        }
        let (pr, pro, pnw, pw, po) = (
            self.ptr(res)?,
            self.ptr(res_out)?,
            self.ptr(norm_w)?,
            self.ptr(w)?,
            self.ptr(dst)?,
        );
        let (pd, add) = match delta {
            Some(d) if d.elem_count() == res.elem_count() => (self.ptr(d)?, 1i32),
            Some(_) => return Err(kernel_err("norm_linear", "delta of the wrong size")),
            None => (pr, 0i32),
        };
        let (n32, k32, eps32) = (n as i32, k as i32, eps as f32);
        let (ppf, pf_bytes) = self.prefetch_of(next)?;
        let cfg = LaunchConfig {
            grid_dim: (g.blocks(n), 1, 1),
            block_dim: (32 * GEMV_WARPS as u32, 1, 1),
            shared_mem_bytes: (g.stage_bytes + if g.norm_smem { t * k * 2 } else { 0 }) as u32,
        };
        let mut b = self.launcher(g.f);
        b.arg(&pw)
            .arg(&pr)
            .arg(&pd)
            .arg(&pro)
            .arg(&pnw)
            .arg(&eps32)
            .arg(&add);
        b.arg(&po).arg(&n32).arg(&k32).arg(&ppf).arg(&pf_bytes);
        // SAFETY: argument types match the entries of `kernels/gemv.cuh` (NORM_ENTRY); shapes
        // are checked above; res and res_out are different buffers (the caller's ping-pong
        // residual).
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// The skinny-matmul kernel (`kind` 0: plain, 1: fused SiLU*up, 2 and 3: the same behind
    /// the fused norm) for `t` rows over a weight of `n` rows of `k` inputs, when one serves
    /// them.
    fn gemv_for(&self, kind: usize, t: usize, (n, k): (usize, usize)) -> Option<Gemv<'_>> {
        if t == 0 || !k.is_multiple_of(8) {
            return None;
        }
        if t <= GEMV_MAX_ROWS {
            let set = self.gemv.as_ref()?;
            let set = match &set.deferred {
                Some((max_k, d)) if kind >= 2 && k <= *max_k => d.as_ref(),
                _ => set,
            };
            // Kinds 1 and 3 (gate|up) stream; the streamed norm kernel holds the norm weights
            // of K <= STREAM_NORM_MAX_K (wider ones take the kernel a block per eight pairs).
            let streams = kind == 1 || (kind == 3 && k <= STREAM_NORM_MAX_K);
            if let Some((s, max)) = set.stream.as_ref().filter(|_| streams) {
                // One row with more than one batch of loads a warp (1.7B's gate|up): the
                // staged kernels where loaded (a warp's second batch has nothing to stage
                // otherwise).
                if let Some(one) = set.stream_one.as_ref().filter(|_| t == 1) {
                    let warps = n.div_ceil(GEMV_WARPS).min(*max) * GEMV_WARPS;
                    let slots = n.div_ceil(warps) * (k / 8).div_ceil(32);
                    if slots > STAGE_MIN_SLOTS {
                        return Some(Gemv {
                            f: &one.fs[kind / 2],
                            rows_per_block: GEMV_WARPS,
                            norm_smem: set.norm_smem,
                            max_blocks: Some(*max),
                            stage_bytes: one.stage_bytes,
                        });
                    }
                }
                return Some(Gemv {
                    f: &s[kind / 2][t - 1],
                    rows_per_block: GEMV_WARPS,
                    norm_smem: set.norm_smem,
                    max_blocks: Some(*max),
                    stage_bytes: 0,
                });
            }
            let long = k > DOUBLE_BUFFER_MIN_K;
            let split = kind == 0 && long && k.is_multiple_of(16);
            if let Some(s) = set.split.as_ref().filter(|_| split) {
                return Some(Gemv {
                    f: &s[t - 1],
                    rows_per_block: GEMV_WARPS / 2,
                    norm_smem: false,
                    max_blocks: None,
                    stage_bytes: 0,
                });
            }
            let f = match &set.double {
                Some(d) if kind.is_multiple_of(2) && long => &d[kind / 2][t - 1],
                _ => &set.fs[kind][t - 1],
            };
            return Some(Gemv {
                f,
                rows_per_block: GEMV_WARPS,
                norm_smem: set.norm_smem,
                max_blocks: None,
                stage_bytes: 0,
            });
        }
        let fs = self.gemv_mma.as_ref()?;
        // `gemv_mma_plain`: the kinds without a norm, on weights of at most its elements.
        if let Some(max) = self.gemv_mma_plain
            && (kind >= 2 || n * k > max)
        {
            return None;
        }
        (t <= GEMV_MMA_MAX_ROWS && k.is_multiple_of(32)).then(|| Gemv {
            f: &fs[kind][t - GEMV_MAX_ROWS - 1],
            rows_per_block: GEMV_MMA_ROWS,
            norm_smem: true,
            max_blocks: None,
            stage_bytes: 0,
        })
    }

    /// Whether the skinny matmuls load their weights evict-first in L2
    /// (`LaunchOptions::weight_evict_first`).
    pub fn weight_evict_first(&self) -> bool {
        self.builds.weight_evict_first
    }

    /// Whether the 1-2-row plain matmuls copy their input into shared memory after their wait
    /// (`LaunchOptions::gemv_x_shared`).
    pub fn gemv_x_shared(&self) -> bool {
        self.builds.x_shared
    }

    /// Whether the 3-8-row tensor-core matmuls stage their input in shared memory
    /// (`LaunchOptions::gemv_mma_x_stage`).
    pub fn gemv_mma_x_stage(&self) -> bool {
        self.builds.mma_x_stage
    }

    /// The shared memory a block of the 1-row streamed gate|up's staged kernels takes for its
    /// stages, when they are loaded (`LaunchOptions::gemv_stream_stage`).
    pub fn gemv_stream_stage_bytes(&self) -> Option<usize> {
        Some(self.gemv.as_ref()?.stream_one.as_ref()?.stage_bytes)
    }

    /// Whether a plain matmul of `t` rows over a weight of `n` rows of `k` inputs runs on the
    /// tensor-core skinny-matmul kernels (3-8 rows; `gemv_mma_plain`'s bound).
    pub(super) fn mma_gemv_serves(&self, t: usize, (n, k): (usize, usize)) -> bool {
        t > GEMV_MAX_ROWS && self.gemv_for(0, t, (n, k)).is_some()
    }

    /// The device pointer and size of the weight a skinny matmul prefetches into L2 (0 bytes:
    /// none).
    fn prefetch_of(&self, next: Option<&Tensor>) -> Result<(u64, u64)> {
        match next {
            Some(w) if self.l2_prefetch => {
                self.check_dtype(w)?;
                let bytes = w.elem_count() * w.dtype().size_in_bytes();
                Ok((self.ptr(w)?, (bytes & !15) as u64))
            }
            _ => Ok((0, 0)),
        }
    }

    fn launch_gemv(
        &self,
        g: Gemv<'_>,
        (pw, px, po): (u64, u64, u64),
        n: usize,
        k: usize,
        next: Option<&Tensor>,
    ) -> Result<()> {
        let (n32, k32) = (n as i32, k as i32);
        let (ppf, pf_bytes) = self.prefetch_of(next)?;
        let cfg = LaunchConfig {
            grid_dim: (g.blocks(n), 1, 1),
            block_dim: (32 * GEMV_WARPS as u32, 1, 1),
            shared_mem_bytes: g.stage_bytes as u32,
        };
        let mut b = self.launcher(g.f);
        b.arg(&pw)
            .arg(&px)
            .arg(&po)
            .arg(&n32)
            .arg(&k32)
            .arg(&ppf)
            .arg(&pf_bytes);
        // SAFETY: argument types match the entries of `kernels/gemv.cuh` (PLAIN_ENTRY); the
        // callers checked the shapes, k is a multiple of 8 and the buffers are contiguous.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// [`CudaKernels::linear_into`] into a new `[T, out]` buffer.
    pub fn linear(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let t = x.elem_count() / x.dim(candle_core::D::Minus1)?.max(1);
        let out = self.alloc_out((t, w.dim(0)?))?;
        self.linear_into(x, w, &out)?;
        Ok(out)
    }
}
