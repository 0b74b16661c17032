//! The decode attention's kernel handles that `CudaKernels` holds (kept beside `handles.rs`
//! for the same reason): the CUDA-core and tensor-core paged decode, the fused decode
//! attention's sets, and the fp8-cache variants of both.

use std::sync::Arc;

use candle_core::DType;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule};

use super::handles::group_functions;
use super::launch::kernel_err;
use super::launch_options::{LaunchOptions, MMA_STAGES_BF16, MMA_STAGES_FP8};
use crate::error::Result;

/// The kernels that read or write an fp8 (e4m3) KV cache, bf16 compute: the `_fp8` variants
/// of the KV write, the decode attention (fused and not) and the flash prefill.
pub(super) struct Fp8Kernels {
    pub(super) kv_write: CudaFunction,
    pub(super) decode: DecodeAttention,
    pub(super) decode_fused: Option<FusedDecode>,
    pub(super) prefill_flash: [CudaFunction; 4],
}

/// The fused decode attention over caches of one dtype (`kernels/fused_decode.cu`), GQA
/// groups 1, 2, 4, 8: the CUDA-core loop's kernels and, with `LaunchOptions::fused_mma`, the
/// tensor-core loop's for steps of at most `mma_rows` rows with the dynamic shared memory a
/// launch of them takes (`mma_one`: those of 1-row steps, `LaunchOptions::fused_mma_one`).
pub(crate) struct FusedDecode {
    pub(super) cores: [CudaFunction; 4],
    pub(super) mma: Option<([CudaFunction; 4], u32)>,
    pub(super) mma_one: Option<([CudaFunction; 4], u32)>,
    pub(super) mma_rows: usize,
}

impl FusedDecode {
    /// The kernels `opts` asks for over caches of `dt` ("bf16" or "fp8"): the lean kernels
    /// with `fused_lean`, else the division ones; with `fused_mma` also the tensor-core loop's
    /// (1 or 2 stages a warp; more are clamped to 2). On sm_90+ (`hopper`) they may run in
    /// clusters of 16 (non-portable).
    pub(super) fn load(
        m: &Arc<CudaModule>,
        opts: &LaunchOptions,
        dt: &str,
        hopper: bool,
    ) -> Result<Self> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute as A;
        let set = |name: &str, smem: u32| -> Result<[CudaFunction; 4]> {
            let fs = group_functions(m, name, dt)?;
            for func in &fs {
                if hopper {
                    func.set_attribute(A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
                        .map_err(|e| kernel_err("decode_fused cluster size", e))?;
                }
                if smem > 0 {
                    func.set_attribute(
                        A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                    .map_err(|e| kernel_err("decode_fused shared memory", e))?;
                }
            }
            Ok(fs)
        };
        let cores = if opts.fused_lean {
            set("decode_fused_lean", 0)?
        } else {
            set("decode_fused", 0)?
        };
        // The tensor-core loop's kernels of `d` stages and their dynamic shared memory.
        let mma_set = |d: u8| -> Result<([CudaFunction; 4], u32)> {
            let d = d.clamp(1, 2);
            let elem = if dt == "fp8" { 1 } else { 2 };
            // 4 warps x stages x a chunk's K and V (16 rows of 128 dims), at least the
            // warps' or half-warps' states (MMA_STATES_BYTES of kernels/decode_mma.cuh).
            let smem = (4 * d as u32 * 2 * 16 * 128 * elem).max(33_280);
            let fs = set(&format!("decode_fused_mma{d}"), smem)?;
            // They serve 1-2-row steps only (`fused_mma_rows`), as the skinny matmuls do.
            if let Some(c) = opts.smem_carveout {
                super::launch::carve(&fs, c);
            }
            Ok((fs, smem))
        };
        let mma = opts.fused_mma.map(mma_set).transpose()?;
        let mma_one = match (opts.fused_mma, opts.fused_mma_one) {
            (Some(d), Some(one)) if one.clamp(1, 2) != d.clamp(1, 2) => Some(mma_set(one)?),
            _ => None,
        };
        Ok(Self {
            cores,
            mma,
            mma_one,
            mma_rows: crate::engine::batch::bucket_bound(opts.fused_mma_rows),
        })
    }

    /// The kernels a launch of `rows` rows takes (the tensor-core ones only when `short`:
    /// every context fits one cluster, in clusters) and its dynamic shared memory in bytes.
    pub(super) fn chosen(&self, rows: usize, short: bool) -> (&[CudaFunction; 4], u32) {
        let mma = match &self.mma_one {
            Some(one) if rows == 1 => Some(one),
            _ => self.mma.as_ref(),
        };
        match mma {
            Some((fs, smem)) if short && rows <= self.mma_rows => (fs, *smem),
            _ => (&self.cores, 0),
        }
    }
}

/// The decode attention over caches of one dtype, GQA groups 1, 2, 4, 8: the CUDA-core kernel
/// (`kernels/decode.cu`) and, with `LaunchOptions::mma_decode`, the tensor-core one
/// (`kernels/decode_mma.cu`, with the dynamic shared memory a launch of it takes). Both write
/// the same partials for the same reduce.
pub(super) struct DecodeAttention {
    pub(super) cores: [CudaFunction; 4],
    pub(super) mma: Option<([CudaFunction; 4], u32)>,
}

impl DecodeAttention {
    /// The tensor-core decode attention (`kernels/decode_mma.cu`, bf16 compute) over caches of
    /// `dt` with the stages `opts` asks for (bf16 caches at most 3), and the dynamic shared
    /// memory of its stages: 4 warps x stages x a chunk's K and V (16 rows of 128 dims each).
    /// None without `LaunchOptions::mma_decode` or for f32 compute.
    pub(super) fn load_mma(
        m: &Arc<CudaModule>,
        opts: &LaunchOptions,
        dtype: DType,
        dt: &str,
    ) -> Result<Option<([CudaFunction; 4], u32)>> {
        if !opts.mma_decode || dtype != DType::BF16 {
            return Ok(None);
        }
        let (d, elem) = if dt == "fp8" {
            (
                opts.mma_decode_stages.unwrap_or(MMA_STAGES_FP8).clamp(2, 4),
                1,
            )
        } else {
            (
                opts.mma_decode_stages
                    .unwrap_or(MMA_STAGES_BF16)
                    .clamp(2, 3),
                2,
            )
        };
        let dt = if dt == "bf16" && opts.mma_decode_split_p {
            "bf16x2"
        } else {
            dt
        };
        let fs = group_functions(m, &format!("paged_decode_mma_d{d}"), dt)?;
        let smem = 4 * d as u32 * 2 * 16 * 128 * elem;
        use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute as A;
        for func in &fs {
            func.set_attribute(
                A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(|e| kernel_err("paged_decode_mma shared memory", e))?;
        }
        Ok(Some((fs, smem)))
    }

    /// The kernels a launch takes (the tensor-core ones where loaded) and their dynamic shared
    /// memory in bytes.
    pub(super) fn chosen(&self) -> (&[CudaFunction; 4], u32) {
        match &self.mma {
            Some((fs, smem)) => (fs, *smem),
            None => (&self.cores, 0),
        }
    }
}
