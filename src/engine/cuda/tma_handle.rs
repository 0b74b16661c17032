//! The handle of the streamed 1-row matmuls (`kernels/gemv_tma_sm90.cu`) that `CudaKernels`
//! holds and `gemv_tma.rs` launches (apart from both, as `handles.rs` is, so that neither
//! imports from the other).

use std::sync::Arc;

use candle_core::DType;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule};

use super::launch::kernel_err;
use super::launch_options::LaunchOptions;
use crate::error::Result;

/// Most ring slots (2 KB pieces in flight) a warp of the streamed 1-row matmul keeps
/// (`MAX_NS` of `kernels/gemv_tma_sm90.cu`).
pub const GEMV_TMA_MAX_SLOTS: u8 = 10;
/// Most dynamic shared memory a launch of the streamed 1-row matmul takes.
pub(super) const TMA_GEMV_MAX_SMEM: usize = 200 << 10;

/// Loads a module from a fatbin, naming it in errors.
type ModuleLoad<'a> = &'a dyn Fn(&[u8], &str) -> Result<Arc<CudaModule>>;

static GEMV_TMA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_tma_sm90.fatbin"));

/// The streamed 1-row matmuls (`kernels/gemv_tma_sm90.cu`, `LaunchOptions::gemv_tma`,
/// `gemv_tma_norm`, `gemv_tma_norm_silu`; launched from `gemv_tma.rs`): each kind's kernels
/// (plain: one; behind the norm: scale first, then deferred) and ring slots a warp, the fewest
/// inputs a plain row takes and whether it takes weights of any row count (checks only).
pub(crate) struct TmaGemv {
    pub(super) plain: Option<(CudaFunction, usize)>,
    pub(super) norm: Option<([CudaFunction; 2], usize)>,
    pub(super) norm_silu: Option<([CudaFunction; 2], usize)>,
    pub(super) min_k: usize,
    pub(super) any_rows: bool,
}

impl TmaGemv {
    /// The kernels `opts` asks for on a bf16 model and an sm_90 GPU, with the shared-memory
    /// carveout of the 1-2-row kernels (`smem_carveout`) and the bounds `gemv_tma_min_k` and
    /// `gemv_tma_any_rows`; `load` loads a module from a fatbin.
    pub(super) fn load(
        opts: &LaunchOptions,
        (dtype, sm90): (DType, bool),
        load: ModuleLoad<'_>,
    ) -> Result<Option<Self>> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute as A;
        let asked = [opts.gemv_tma, opts.gemv_tma_norm, opts.gemv_tma_norm_silu];
        if dtype != DType::BF16 || asked.iter().all(Option::is_none) {
            return Ok(None);
        }
        if !sm90 {
            tracing::debug!("gemv_tma needs an sm_90 GPU (H100/H200): the skinny matmuls instead");
            return Ok(None);
        }
        let m = load(GEMV_TMA, "gemv_tma_sm90")?;
        let f = |name: &str| -> Result<CudaFunction> {
            let f = m
                .load_function(name)
                .map_err(|e| kernel_err(&format!("function {name}"), e))?;
            f.set_attribute(
                A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                TMA_GEMV_MAX_SMEM as i32,
            )
            .map_err(|e| kernel_err(&format!("{name} shared memory"), e))?;
            if let Some(c) = opts.smem_carveout {
                super::launch::carve([&f], c);
            }
            Ok(f)
        };
        let slots = |n: u8| usize::from(n.clamp(1, GEMV_TMA_MAX_SLOTS));
        let pair = |kind: &str, n: u8| -> Result<([CudaFunction; 2], usize)> {
            let fs = [
                f(&format!("gemv_tma_{kind}"))?,
                f(&format!("gemv_tma_d{kind}"))?,
            ];
            Ok((fs, slots(n)))
        };
        Ok(Some(Self {
            plain: match opts.gemv_tma {
                Some(n) => Some((f("gemv_tma")?, slots(n))),
                None => None,
            },
            norm: opts.gemv_tma_norm.map(|n| pair("norm", n)).transpose()?,
            norm_silu: (opts.gemv_tma_norm_silu)
                .map(|n| pair("norm_silu", n.max(2)))
                .transpose()?,
            min_k: opts.gemv_tma_min_k,
            any_rows: opts.gemv_tma_any_rows,
        }))
    }
}
