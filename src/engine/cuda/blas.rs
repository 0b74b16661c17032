//! [`Blas`]: a cuBLAS handle on the kernels' stream with a workspace of its own, so matmuls
//! write into the engine's buffers and allocate nothing (graph capture), and [`Lt`]: the
//! cuBLASLt matmuls of decode-sized steps, one algorithm a row class.

use std::collections::HashMap;
use std::ffi::c_void;

use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, sys};
use candle_core::cuda_backend::cudarc::cublaslt::{result as lt, sys as lt_sys};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream};

use super::launch::kernel_err;
use crate::error::Result;

/// Bytes of the cuBLAS workspace (the size NVIDIA recommends for Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle on the kernels' stream, a cuBLASLt handle (matmuls of a row class's
/// algorithm, [`Lt`]) and their workspace (one at a time on the stream).
pub(crate) struct Blas {
    pub(crate) handle: CudaBlas,
    pub(crate) lt: Lt,
    /// The workspace's device address and size (the cuBLASLt calls pass it).
    pub(crate) workspace: (u64, usize),
    _workspace: CudaSlice<u8>,
}

impl Blas {
    pub(crate) fn new(
        stream: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    ) -> Result<Self> {
        let handle = CudaBlas::new(stream.clone()).map_err(|e| kernel_err("cuBLAS", e))?;
        // SAFETY: the workspace is only used by cuBLAS, which writes before it reads.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .map_err(|e| kernel_err("cuBLAS workspace", e))?;
        use candle_core::cuda_backend::cudarc::driver::DevicePtr;
        let (ptr, _guard) = workspace.device_ptr(stream);
        // SAFETY: the workspace outlives the handle (both live in this struct, the handle is
        // dropped first as it is declared first).
        unsafe {
            sys::cublasSetWorkspace_v2(*handle.handle(), ptr as *mut c_void, WORKSPACE_BYTES)
                .result()
        }
        .map_err(|e| kernel_err("cuBLAS workspace", e))?;
        drop(_guard);
        Ok(Self {
            handle,
            lt: Lt::new()?,
            workspace: (ptr, WORKSPACE_BYTES),
            _workspace: workspace,
        })
    }
}

/// A cache key: the weight's out and in sizes, a row count (a step's, or a class's bound),
/// bf16 (else f32).
type LtKey = (usize, usize, usize, bool);

/// cuBLASLt matmuls whose algorithm depends on the step's row class, not its row count
/// ([`crate::engine::batch::row_class`]): cuBLAS's own choice changes with the row count
/// (split-K for some counts and not others, on the H200 for the 30B-A3B's o at 57-63 rows and
/// 0.6B's down at 73-80; `graph_check --rows-check`), so an eager step and the padded graph
/// bucket that replays it gave some rows other bits. One algorithm a (weight shape, class)
/// gives every row the same bits at any count of the class.
pub(crate) struct Lt {
    handle: lt_sys::cublasLtHandle_t,
    cache: parking_lot::Mutex<LtCache>,
}

/// What [`Lt`] builds once: descriptors per (shape, row count), algorithms per (shape, class).
/// Both are bounded: row counts go up to `gemm::LT_MAX_ROWS`, shapes are a model's.
#[derive(Default)]
struct LtCache {
    /// The descriptors of each (out, in, rows, dtype): host objects an eager step would
    /// otherwise build and destroy at every matmul.
    descs: HashMap<LtKey, LtDescs>,
    /// The algorithm of each (out, in, row class, dtype); None where cuBLASLt offers none
    /// (the matmul then goes through `cublasGemmEx`).
    algos: HashMap<LtKey, Option<lt_sys::cublasLtMatmulAlgo_t>>,
}

impl LtCache {
    /// The descriptors of `key` in `lty`, built on first use.
    fn descs(&mut self, key: LtKey, lty: lt_sys::cudaDataType) -> Result<&LtDescs> {
        Ok(match self.descs.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let (n_out, k, t, _) = key;
                v.insert(LtDescs::new(lty, n_out, k, t)?)
            }
        })
    }
}

// SAFETY: the handle is only used under the kernels' one stream (every launch is ordered on
// it) and cuBLASLt handles may be used from any host thread; the cache (host descriptors,
// used by one call at a time) is behind a mutex.
unsafe impl Send for Lt {}
// SAFETY: as above.
unsafe impl Sync for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `Lt::new` and is destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// A matmul's cuBLASLt descriptors (the matmul, then the layouts of w, x and out), destroyed
/// when dropped.
struct LtDescs {
    desc: lt_sys::cublasLtMatmulDesc_t,
    layouts: Vec<lt_sys::cublasLtMatrixLayout_t>,
}

impl Drop for LtDescs {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created once by `LtDescs::new` and is destroyed once.
        unsafe {
            for l in &self.layouts {
                let _ = lt::destroy_matrix_layout(*l);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

impl LtDescs {
    /// The descriptors of `out [t, n_out] = x [t, k] · w [n_out, k]ᵀ` in `lty` with f32
    /// sums. Column-major: outᵀ [n_out, t] = W [n_out, k] (the row-major weight read as
    /// [k, n_out], transposed) · xᵀ [k, t].
    fn new(lty: lt_sys::cudaDataType, n_out: usize, k: usize, t: usize) -> Result<Self> {
        let err = |e| kernel_err("linear (cuBLASLt)", e);
        let desc = lt::create_matmul_desc(
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lt_sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(err)?;
        let mut d = LtDescs {
            desc,
            layouts: Vec::with_capacity(3),
        };
        let (op_t, op_n) = (1i32, 0i32);
        // SAFETY: the attributes are i32 (cublasOperation_t) as the descriptor expects.
        unsafe {
            for (attr, v) in [
                (
                    lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                    &op_t,
                ),
                (
                    lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                    &op_n,
                ),
            ] {
                lt::set_matmul_desc_attribute(d.desc, attr, (v as *const i32).cast(), 4)
                    .map_err(err)?;
            }
        }
        for (rows, cols) in [(k, n_out), (k, t), (n_out, t)] {
            let l = lt::create_matrix_layout(lty, rows as u64, cols as u64, rows as i64)
                .map_err(err)?;
            d.layouts.push(l);
        }
        Ok(d)
    }

    /// The layouts of w, x and out.
    fn abc(&self) -> [lt_sys::cublasLtMatrixLayout_t; 3] {
        [self.layouts[0], self.layouts[1], self.layouts[2]]
    }
}

impl Lt {
    fn new() -> Result<Self> {
        Ok(Self {
            handle: lt::create_handle().map_err(|e| kernel_err("cuBLASLt", e))?,
            cache: Default::default(),
        })
    }

    /// The algorithm cuBLASLt's heuristic ranks first for the matmul of `d` within a
    /// workspace of `bytes`, if any.
    fn heuristic(&self, d: &LtDescs, bytes: usize) -> Result<Option<lt_sys::cublasLtMatmulAlgo_t>> {
        let pref = lt::create_matmul_pref().map_err(|e| kernel_err("linear (cuBLASLt)", e))?;
        let bytes = bytes as u64;
        let [a, b, c] = d.abc();
        // SAFETY: the preference and descriptors are live; the attribute is a u64.
        let found = unsafe {
            let set = lt::set_matmul_pref_attribute(
                pref,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&bytes as *const u64).cast(),
                8,
            );
            let h = set
                .and_then(|_| lt::get_matmul_algo_heuristic(self.handle, d.desc, a, b, c, c, pref));
            let _ = lt::destroy_matmul_pref(pref);
            h.ok().map(|h| h.algo)
        };
        Ok(found)
    }

    /// `out [t, n_out] = x [t, k] · w [n_out, k]ᵀ` (pointers of `ty` elements, f32 sums) on
    /// `stream`, with the algorithm of `t`'s row class (`class` rows); false when cuBLASLt has
    /// none for the shape (nothing launched).
    pub(crate) fn linear(
        &self,
        stream: &CudaStream,
        ty: sys::cudaDataType,
        (n_out, k, t, class): (usize, usize, usize, usize),
        (pw, px, po): (u64, u64, u64),
        (workspace, workspace_bytes): (u64, usize),
    ) -> Result<bool> {
        let lty: lt_sys::cudaDataType = match ty {
            sys::cudaDataType::CUDA_R_16BF => lt_sys::cudaDataType::CUDA_R_16BF,
            _ => lt_sys::cudaDataType::CUDA_R_32F,
        };
        let bf16 = lty == lt_sys::cudaDataType::CUDA_R_16BF;
        // One call at a time: the descriptors are host objects cuBLASLt reads during the call.
        let mut cache = self.cache.lock();
        let class_key = (n_out, k, class, bf16);
        let algo = match cache.algos.get(&class_key) {
            Some(a) => *a,
            None => {
                let found = self.heuristic(cache.descs(class_key, lty)?, workspace_bytes)?;
                cache.algos.insert(class_key, found);
                found
            }
        };
        let Some(algo) = algo else {
            return Ok(false);
        };
        let d = cache.descs((n_out, k, t, bf16), lty)?;
        let [a, b, c] = d.abc();
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: the pointers are live device buffers of the sizes the caller checked, the
        // workspace is the handle's own (`Blas`), everything on `stream`.
        unsafe {
            lt::matmul(
                self.handle,
                d.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                pw as *const c_void,
                a,
                px as *const c_void,
                b,
                po as *const c_void,
                c,
                po as *mut c_void,
                c,
                &algo,
                workspace as *mut c_void,
                workspace_bytes,
                stream.cu_stream() as lt_sys::cudaStream_t,
            )
        }
        .map(|_| true)
        .or_else(|e| {
            // An algorithm the class found but this count cannot take: cublasGemmEx instead.
            tracing::debug!(n_out, k, t, class, "cuBLASLt algorithm refused: {e}");
            Ok(false)
        })
    }
}
