//! The handle of the split tensor-core skinny matmuls of 3-8-row decode steps
//! (`LaunchOptions::gemv_mma_split`, `kernels/gemv_mma.cu` `mma_gemv_c2_*` and
//! `mma_gemv_res_c2_*`) that `CudaKernels` holds and `gemm.rs` / `gemm_presum.rs` launch (apart
//! from both, as `handles.rs` is, so that neither imports from the other): a group of 16
//! output rows on a cluster of two blocks of 4 warps instead of one block of 8, for weights
//! of fewer groups than the GPU has SMs. The same bits as the one-block kernels.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};

use super::launch::kernel_err;
use super::launch_options::LaunchOptions;
use crate::error::Result;

/// Token rows of the kernels: `FIRST_ROWS..=LAST_ROWS` (those of the tensor-core kernels).
const FIRST_ROWS: usize = 3;
const LAST_ROWS: usize = 8;

/// The split kernels: plain (kind 0) and the presummed norm's residual add (kind 1), one a row
/// count.
pub(crate) struct MmaSplit {
    fs: [Vec<CudaFunction>; 2],
}

impl MmaSplit {
    /// The kernels from the loaded `gemv_mma` module when `opts.gemv_mma_split` asks for them
    /// on a GPU with thread-block clusters (`hopper`: sm_90+).
    pub(super) fn load(
        m: Option<&Arc<CudaModule>>,
        opts: &LaunchOptions,
        hopper: bool,
    ) -> Result<Option<Self>> {
        let Some(m) = m.filter(|_| opts.gemv_mma_split && hopper) else {
            return Ok(None);
        };
        let set = |kind: &str| -> Result<Vec<CudaFunction>> {
            (FIRST_ROWS..=LAST_ROWS)
                .map(|t| {
                    let name = format!("{kind}_t{t}_bf16");
                    m.load_function(&name)
                        .map_err(|e| kernel_err(&format!("function {name}"), e))
                })
                .collect()
        };
        Ok(Some(Self {
            fs: [set("mma_gemv_c2")?, set("mma_gemv_res_c2")?],
        }))
    }

    /// The kernel of `kind` (0: plain, 1: residual add) for `t` token rows over `groups`
    /// groups of 16 output rows, when they are fewer than `sms`.
    pub(super) fn kernel(
        &self,
        kind: usize,
        t: usize,
        groups: usize,
        sms: usize,
    ) -> Option<&CudaFunction> {
        let f = self.fs.get(kind)?.get(t.checked_sub(FIRST_ROWS)?)?;
        (groups < sms).then_some(f)
    }

    /// Grid (groups, 1, 2) in clusters of two along z, 4 warps a block (the launcher's
    /// `cluster_z(2)`).
    pub(super) fn config(groups: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (groups as u32, 1, 2),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}
