//! Which build of a kernel file the launch options pick: `build.rs` compiles some files a
//! second time with a macro defined (its `VARIANTS`), machine code that differs from the
//! default build in cache hints or in work whose results nothing reads, so the outputs are the
//! same.

use super::launch_options::LaunchOptions;

static GEMV: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv.fatbin"));
static GEMV_MMA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_mma.fatbin"));
// The weights evict-first in L2 (`LaunchOptions::weight_evict_first`).
static GEMV_EF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_ef.fatbin"));
static GEMV_MMA_EF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_mma_ef.fatbin"));
// With the 1-2-row plain matmuls' input in shared memory (`LaunchOptions::gemv_x_shared`).
static GEMV_EF_XS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_ef_xs.fatbin"));
// With the 3-8-row tensor-core matmuls' input staged (`LaunchOptions::gemv_mma_x_stage`).
static GEMV_MMA_EF_XS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_mma_ef_xs.fatbin"));
static FUSED_DECODE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_decode.fatbin"));

/// Which of the second builds were picked (kept by the kernel set, so a check can tell that
/// an option's build was loaded and did not fall back).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Picked {
    /// The skinny matmuls load their weights evict-first (`LaunchOptions::weight_evict_first`).
    pub(super) weight_evict_first: bool,
    /// The 1-2-row plain matmuls read their input from shared memory
    /// (`LaunchOptions::gemv_x_shared`).
    pub(super) x_shared: bool,
    /// The 3-8-row tensor-core matmuls stage their input in shared memory
    /// (`LaunchOptions::gemv_mma_x_stage`).
    pub(super) mma_x_stage: bool,
}

/// The builds of `gemv.cu`, `gemv_mma.cu` and `fused_decode.cu` the options ask for.
pub(super) struct Builds {
    pub(super) gemv: &'static [u8],
    pub(super) gemv_mma: &'static [u8],
    pub(super) fused_decode: &'static [u8],
    /// Which second builds these are.
    pub(super) picked: Picked,
}

impl Builds {
    /// The builds of `opts`.
    pub(super) fn pick(opts: &LaunchOptions) -> Self {
        let ef = opts.weight_evict_first;
        let xs = ef && opts.gemv_x_shared;
        let mma_xs = ef && opts.gemv_mma_x_stage;
        Self {
            gemv: if xs {
                GEMV_EF_XS
            } else if ef {
                GEMV_EF
            } else {
                GEMV
            },
            gemv_mma: if mma_xs {
                GEMV_MMA_EF_XS
            } else if ef {
                GEMV_MMA_EF
            } else {
                GEMV_MMA
            },
            fused_decode: FUSED_DECODE,
            picked: Picked {
                weight_evict_first: ef,
                x_shared: xs,
                mma_x_stage: mma_xs,
            },
        }
    }
}
