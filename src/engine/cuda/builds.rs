//! Which build of a kernel file the launch options pick: `build.rs` compiles some files a
//! second time with a macro defined (its `VARIANTS`), machine code that differs from the
//! default build in cache hints or in work whose results nothing reads, so the outputs are the
//! same.

use super::launch_options::LaunchOptions;

static GEMV: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv.fatbin"));
static GEMV_MMA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_mma.fatbin"));
// The weights evict-first in L2 (`LaunchOptions::weight_evict_first`).
static GEMV_EF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_ef.fatbin"));
// ... with the streamed gate|up a loop of whole rows (`LaunchOptions::gemv_stream_fit`).
static GEMV_EF_FIT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_ef_fit.fatbin"));
// ... and a one-row batch's halves refilled as summed (`LaunchOptions::gemv_stream_pipe`).
static GEMV_EF_PIPE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_ef_pipe.fatbin"));
static GEMV_MMA_EF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_mma_ef.fatbin"));
static FUSED_DECODE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_decode.fatbin"));

/// The builds of `gemv.cu`, `gemv_mma.cu` and `fused_decode.cu` the options ask for.
pub(super) struct Builds {
    pub(super) gemv: &'static [u8],
    pub(super) gemv_mma: &'static [u8],
    pub(super) fused_decode: &'static [u8],
    /// Whether they load their weights evict-first (`LaunchOptions::weight_evict_first`).
    pub(super) weight_evict_first: bool,
    /// Whether `gemv` is the build whose streamed gate|up loops over whole rows
    /// (`LaunchOptions::gemv_stream_fit`).
    pub(super) gemv_stream_fit: bool,
    /// Whether that build also refills a one-row batch's halves as they are summed
    /// (`LaunchOptions::gemv_stream_pipe`).
    pub(super) gemv_stream_pipe: bool,
}

impl Builds {
    /// The builds of `opts`.
    pub(super) fn pick(opts: &LaunchOptions) -> Self {
        let ef = opts.weight_evict_first;
        Self {
            gemv: match (ef, opts.gemv_stream_fit, opts.gemv_stream_pipe) {
                (true, _, true) => GEMV_EF_PIPE,
                (true, true, false) => GEMV_EF_FIT,
                (true, false, false) => GEMV_EF,
                (false, ..) => GEMV,
            },
            gemv_mma: if ef { GEMV_MMA_EF } else { GEMV_MMA },
            fused_decode: FUSED_DECODE,
            weight_evict_first: ef,
            gemv_stream_fit: ef && (opts.gemv_stream_fit || opts.gemv_stream_pipe),
            gemv_stream_pipe: ef && opts.gemv_stream_pipe,
        }
    }
}
