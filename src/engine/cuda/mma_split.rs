//! The handle of the split tensor-core skinny matmuls of 3-8-row decode steps
//! (`LaunchOptions::gemv_mma_split`, `kernels/gemv_mma.cu` `mma_gemv_c2_*` and
//! `mma_gemv_res_c2_*`, `mma_gemv_pre*_c2_*`) that `CudaKernels` holds and `gemm.rs` /
//! `gemm_presum.rs` launch (apart from both, as `handles.rs` is, so that neither imports from
//! the other): a group of 16 output rows on a cluster of two blocks of 4 warps instead of one
//! block of 8, for weights of few groups. The same bits as the one-block kernels.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};

use super::launch::kernel_err;
use super::launch_options::LaunchOptions;
use crate::error::Result;

/// Token rows of the kernels: `FIRST_ROWS..=LAST_ROWS` (those of the tensor-core kernels).
const FIRST_ROWS: usize = 3;
const LAST_ROWS: usize = 8;

/// The kinds, as [`MmaSplit::kernel`] takes them: plain, SiLU*up, the presummed norm's
/// residual add, and plain and SiLU*up behind the presummed norm.
pub(super) const PLAIN: usize = 0;
pub(super) const SILU: usize = 1;
pub(super) const RES: usize = 2;
pub(super) const PRE: usize = 3;
pub(super) const PRE_SILU: usize = 4;
const NAMES: [&str; 5] = [
    "mma_gemv_c2",
    "mma_gemv_silu_c2",
    "mma_gemv_res_c2",
    "mma_gemv_pre_c2",
    "mma_gemv_pre_silu_c2",
];

/// The split kernels of each kind, one a row count, and the most groups of 16 output rows
/// (gate|up pairs) a weight they take may have.
pub(crate) struct MmaSplit {
    fs: Vec<Vec<CudaFunction>>,
    max_groups: usize,
}

impl MmaSplit {
    /// The kernels from the loaded `gemv_mma` module when `opts.gemv_mma_split` asks for them
    /// on a GPU with thread-block clusters (`hopper`: sm_90+).
    pub(super) fn load(
        m: Option<&Arc<CudaModule>>,
        opts: &LaunchOptions,
        hopper: bool,
    ) -> Result<Option<Self>> {
        let (Some(m), Some(max_groups)) = (m.filter(|_| hopper), opts.gemv_mma_split) else {
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
        let fs = NAMES.iter().map(|k| set(k)).collect::<Result<_>>()?;
        Ok(Some(Self { fs, max_groups }))
    }

    /// The kernel of `kind` for `t` token rows over `groups` groups of 16 output rows (gate|up
    /// pairs), when the option takes so many.
    pub(super) fn kernel(&self, kind: usize, t: usize, groups: usize) -> Option<&CudaFunction> {
        let f = self.fs.get(kind)?.get(t.checked_sub(FIRST_ROWS)?)?;
        (groups <= self.max_groups).then_some(f)
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
