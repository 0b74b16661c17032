//! Which build of a kernel file the launch options pick: `build.rs` compiles some files a
//! second time with a macro defined (its `VARIANTS`), machine code that differs from the
//! default build in cache hints or in work whose results nothing reads, so the outputs are the
//! same.

use super::launch::kernel_err;
use super::launch_options::LaunchOptions;
use crate::error::Result;

static GEMV: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv.fatbin"));
static GEMV_MMA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_mma.fatbin"));
// The weights evict-first in L2 (`LaunchOptions::weight_evict_first`).
static GEMV_EF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_ef.fatbin"));
static GEMV_MMA_EF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_mma_ef.fatbin"));
static FUSED_DECODE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_decode.fatbin"));
// The new key normed by every block (`LaunchOptions::fused_warm_key`).
static FUSED_DECODE_WK: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_decode_wk.fatbin"));
// The tensor-core kernels without the paths the host never launches them for
// (`LaunchOptions::fused_tc_only`).
static FUSED_DECODE_TC: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_decode_tc.fatbin"));
// The RoPE factors formed before the wait (`LaunchOptions::fused_early_rope`).
static FUSED_DECODE_ER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_decode_er.fatbin"));
// All three.
static FUSED_DECODE_ALL: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/fused_decode_all.fatbin"));

/// The builds of `gemv.cu`, `gemv_mma.cu` and `fused_decode.cu` the options ask for.
pub(super) struct Builds {
    pub(super) gemv: &'static [u8],
    pub(super) gemv_mma: &'static [u8],
    pub(super) fused_decode: &'static [u8],
    /// Whether they load their weights evict-first (`LaunchOptions::weight_evict_first`).
    pub(super) weight_evict_first: bool,
}

impl Builds {
    /// The builds of `opts` on a GPU of compute capability 9.0 or not (`sm90`); an error for a
    /// combination of the fused decode attention's build switches that has no build (each
    /// alone, or all three), or for any of them off sm_90 (`build.rs` compiles them for sm_90
    /// only: measurement builds).
    pub(super) fn pick(opts: &LaunchOptions, sm90: bool) -> Result<Self> {
        let ef = opts.weight_evict_first;
        let switches = opts.fused_warm_key || opts.fused_tc_only || opts.fused_early_rope;
        if switches && !sm90 {
            return Err(kernel_err(
                "fused_decode",
                "fused_warm_key, fused_tc_only and fused_early_rope are built for sm_90 GPUs \
                 (H100, H200) only; turn them off on this GPU",
            ));
        }
        let fused_decode = match (
            opts.fused_warm_key,
            opts.fused_tc_only,
            opts.fused_early_rope,
        ) {
            (false, false, false) => FUSED_DECODE,
            (true, false, false) => FUSED_DECODE_WK,
            (false, true, false) => FUSED_DECODE_TC,
            (false, false, true) => FUSED_DECODE_ER,
            (true, true, true) => FUSED_DECODE_ALL,
            _ => {
                return Err(kernel_err(
                    "fused_decode",
                    "fused_warm_key, fused_tc_only and fused_early_rope are built each alone \
                     or all three together; turn on one of them, or all three",
                ));
            }
        };
        Ok(Self {
            gemv: if ef { GEMV_EF } else { GEMV },
            gemv_mma: if ef { GEMV_MMA_EF } else { GEMV_MMA },
            fused_decode,
            weight_evict_first: ef,
        })
    }
}
