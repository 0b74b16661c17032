//! Which build of a kernel file the launch options pick: `build.rs` compiles some files a
//! second time with a macro defined (its `VARIANTS`), machine code that differs from the
//! default build only in cache hints or in when loads are issued, so the outputs are the same.

use super::launch_options::LaunchOptions;

static GEMV: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv.fatbin"));
static GEMV_MMA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_mma.fatbin"));
// The weights evict-first in L2 (`LaunchOptions::weight_evict_first`).
static GEMV_EF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_ef.fatbin"));
static GEMV_MMA_EF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_mma_ef.fatbin"));
// The 1-2-row block norm's weights before the wait (`LaunchOptions::norm_preload`).
static GEMV_PL: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_pl.fatbin"));
static GEMV_EF_PL: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_ef_pl.fatbin"));
static MOE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/moe.fatbin"));
// The ranked MoE down + sum in 96 registers (`LaunchOptions::moe_down_lean`).
static MOE_LN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/moe_ln.fatbin"));

/// The builds of `gemv.cu`, `gemv_mma.cu` and `moe.cu` the options ask for.
pub(super) struct Builds {
    pub(super) gemv: &'static [u8],
    pub(super) gemv_mma: &'static [u8],
    pub(super) moe: &'static [u8],
    /// Which forms of the skinny matmuls those are.
    pub(super) gemv_build: GemvBuild,
}

/// Which build of the skinny matmuls an engine loaded.
#[derive(Debug, Clone, Copy)]
pub(super) struct GemvBuild {
    /// Their weights evict-first (`LaunchOptions::weight_evict_first`).
    pub(super) evict_first: bool,
    /// The block norms' weights before the wait (`LaunchOptions::norm_preload`).
    pub(super) norm_preload: bool,
}

impl Builds {
    /// The builds of `opts`.
    pub(super) fn pick(opts: &LaunchOptions) -> Self {
        let ef = opts.weight_evict_first;
        Self {
            gemv: match (ef, opts.norm_preload) {
                (false, false) => GEMV,
                (true, false) => GEMV_EF,
                (false, true) => GEMV_PL,
                (true, true) => GEMV_EF_PL,
            },
            gemv_mma: if ef { GEMV_MMA_EF } else { GEMV_MMA },
            moe: if opts.moe_down_lean { MOE_LN } else { MOE },
            gemv_build: GemvBuild {
                evict_first: ef,
                norm_preload: opts.norm_preload,
            },
        }
    }
}
