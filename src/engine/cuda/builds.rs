//! Which build of a kernel file the launch options pick: `build.rs` compiles some files a
//! second time with a macro defined (its `VARIANTS`), machine code that differs from the
//! default build only in cache hints and prefetches, so the outputs are the same.

use super::launch_options::LaunchOptions;

static GEMV: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv.fatbin"));
static GEMV_MMA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_mma.fatbin"));
static FUSED_DECODE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_decode.fatbin"));
// The weights evict-first in L2 (`LaunchOptions::weight_evict_first`).
static GEMV_EF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_ef.fatbin"));
static GEMV_MMA_EF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_mma_ef.fatbin"));
// The K/V evict-first in L2 (`kv_evict_first`), and with it the next layer's K/V prefetched
// (`kv_next_prefetch`).
static FUSED_KEF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_decode_kef.fatbin"));
static FUSED_KNP: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_decode_knp.fatbin"));

/// The builds of `gemv.cu`, `gemv_mma.cu` and `fused_decode.cu` the options ask for.
pub(super) struct Builds {
    pub(super) gemv: &'static [u8],
    pub(super) gemv_mma: &'static [u8],
    pub(super) fused_decode: &'static [u8],
    /// What they do with L2.
    pub(super) hints: CacheHints,
}

/// The cache hints and prefetches of the builds the options picked.
#[derive(Debug, Clone, Copy)]
pub(super) struct CacheHints {
    /// The skinny matmuls' weights evict-first (`LaunchOptions::weight_evict_first`).
    pub(super) weights: bool,
    /// The fused attention's K/V evict-first (`kv_evict_first`, or `kv_next_prefetch`).
    pub(super) kv: bool,
    /// Whether and when the fused attention prefetches the next layer's K/V.
    pub(super) kv_next: KvNext,
}

/// When the fused decode attention prefetches the next layer's K/V into L2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KvNext {
    /// It does not.
    Off,
    /// Before its wait on the qkv matmul (`LaunchOptions::kv_next_prefetch`).
    BeforeWait,
    /// Once its attention loop has read its own K/V (`kv_next_prefetch_late`).
    AfterLoop,
}

impl Builds {
    /// The builds of `opts` (`kv_next_prefetch` implies the K/V evict-first).
    pub(super) fn pick(opts: &LaunchOptions) -> Self {
        let (ef, knp) = (opts.weight_evict_first, opts.kv_next_prefetch);
        let kef = opts.kv_evict_first || knp;
        Self {
            gemv: if ef { GEMV_EF } else { GEMV },
            gemv_mma: if ef { GEMV_MMA_EF } else { GEMV_MMA },
            fused_decode: match (kef, knp) {
                (_, true) => FUSED_KNP,
                (true, false) => FUSED_KEF,
                (false, false) => FUSED_DECODE,
            },
            hints: CacheHints {
                weights: ef,
                kv: kef,
                kv_next: match (knp, opts.kv_next_prefetch_late) {
                    (false, _) => KvNext::Off,
                    (true, false) => KvNext::BeforeWait,
                    (true, true) => KvNext::AfterLoop,
                },
            },
        }
    }
}
