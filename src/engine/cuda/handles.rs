//! Handles that `CudaKernels` holds and the launch files use (kept apart so that those files
//! and `kernels.rs` do not import from each other).

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaEvent, CudaFunction, CudaModule, CudaStream, PinnedHostSlice,
};

use candle_core::{DType, Device, Tensor};

use super::launch::kernel_err;
use super::launch_options::LaunchOptions;
use crate::error::Result;

/// Warps per block of `kernels/gemv.cu` (`WARPS`); a warp takes one output row (or gate/up
/// pair) in the CUDA-core kernels.
pub(super) const GEMV_WARPS: usize = 8;
/// Widest input (K) of the streamed-rows norm kernel: the norm weights a thread holds in
/// registers (`NW_REGS` of `kernels/gemv.cu`) times a block's 256 threads.
pub(super) const STREAM_NORM_MAX_K: usize = 16 * 32 * GEMV_WARPS;
/// Most ring slots (2 KB pieces in flight) a warp of the streamed 1-row matmul keeps
/// (`MAX_NS` of `kernels/gemv_tma_sm90.cu`).
pub const GEMV_TMA_MAX_SLOTS: u8 = 10;
/// Most dynamic shared memory a launch of the streamed 1-row matmul takes.
pub(super) const TMA_GEMV_MAX_SMEM: usize = 200 << 10;

/// Loads a module from a fatbin, naming it in errors.
type ModuleLoad<'a> = &'a dyn Fn(&[u8], &str) -> Result<Arc<CudaModule>>;

static GEMV_TMA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv_tma_sm90.fatbin"));

/// The streamed 1-row matmul (`kernels/gemv_tma_sm90.cu`, `LaunchOptions::gemv_tma`; launched
/// from `gemv_tma.rs`), its ring's slots a warp, the fewest inputs a row it takes, whether
/// it takes weights of any row count (checks only), its ring's slots for the lm_head
/// (`gemv_tma_head`) and its lm_head + argmax entry (`gemv_tma_head_argmax`).
pub(crate) struct TmaGemv {
    pub(super) f: CudaFunction,
    pub(super) slots: usize,
    pub(super) min_k: usize,
    pub(super) any_rows: bool,
    pub(super) head: Option<usize>,
    pub(super) argmax: Option<CudaFunction>,
}

impl TmaGemv {
    /// The kernel when `opts.gemv_tma` asks for it on a bf16 model and an sm_90 GPU, with the
    /// shared-memory carveout of the 1-2-row kernels (`smem_carveout`) and the bounds
    /// `gemv_tma_min_k` and `gemv_tma_any_rows`; `load` loads a module from a fatbin.
    pub(super) fn load(
        opts: &LaunchOptions,
        (dtype, sm90): (DType, bool),
        load: ModuleLoad<'_>,
    ) -> Result<Option<Self>> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute as A;
        let Some(n) = opts.gemv_tma.filter(|_| dtype == DType::BF16) else {
            if opts.gemv_tma_head.is_some() {
                tracing::debug!("gemv_tma_head needs gemv_tma on a bf16 model: lm_head on cuBLAS");
            }
            return Ok(None);
        };
        if !sm90 {
            tracing::debug!("gemv_tma needs an sm_90 GPU (H100/H200): the skinny matmuls instead");
            return Ok(None);
        }
        let m = load(GEMV_TMA, "gemv_tma_sm90")?;
        let f = m
            .load_function("gemv_tma")
            .map_err(|e| kernel_err("function gemv_tma", e))?;
        let head = opts.gemv_tma_head;
        let argmax = (head.is_some() && opts.gemv_tma_head_argmax && opts.graph_argmax)
            .then(|| m.load_function("gemv_tma_argmax"))
            .transpose()
            .map_err(|e| kernel_err("function gemv_tma_argmax", e))?;
        for g in std::iter::once(&f).chain(argmax.as_ref()) {
            g.set_attribute(
                A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                TMA_GEMV_MAX_SMEM as i32,
            )
            .map_err(|e| kernel_err("gemv_tma shared memory", e))?;
            if let Some(c) = opts.smem_carveout {
                super::launch::carve([g], c);
            }
        }
        let slots = |n: u8| usize::from(n.clamp(1, GEMV_TMA_MAX_SLOTS));
        Ok(Some(Self {
            f,
            slots: slots(n),
            min_k: opts.gemv_tma_min_k,
            any_rows: opts.gemv_tma_any_rows,
            head: head.map(slots),
            argmax,
        }))
    }
}

/// The skinny-matmul kernels of 1-2 rows an engine launches (`kernels/gemv.cu`; launched from
/// `gemm.rs`) and how their grids are sized.
pub(crate) struct GemvSet {
    /// Plain, fused with SiLU*up, and both behind the fused add+RMSNorm, a function per row
    /// count.
    pub(super) fs: [Vec<CudaFunction>; 4],
    /// Whether the norm kernels hold the normed rows in shared memory (off: the per-warp norm).
    pub(super) norm_smem: bool,
    /// The gate|up kernels (SiLU*up alone and behind the norm) on streamed rows
    /// (`LaunchOptions::gemv_stream`), and the most blocks a launch of them takes.
    pub(super) stream: Option<([Vec<CudaFunction>; 2], usize)>,
    /// The 1-row gate|up kernels that take `stream`'s place at one row where a warp has more
    /// than one batch of loads, when the launch options ask for a staged batch
    /// (`LaunchOptions::gemv_stream_stage`).
    pub(super) stream_one: Option<StreamOne>,
    /// The plain and norm kernels with two batches of loads in flight, for rows of more than
    /// 2,048 inputs (`LaunchOptions::gemv_double_buffer`).
    pub(super) double: Option<[Vec<CudaFunction>; 2]>,
    /// The plain kernel with two warps a row, for rows of more than 2,048
    /// inputs, a multiple of 16 (`LaunchOptions::gemv_split_k`).
    pub(super) split: Option<Vec<CudaFunction>>,
    /// The same set with the norms' scale deferred (`dnorm_*`), for norm kinds over at most
    /// this many inputs (`LaunchOptions::norm_deferred`).
    pub(super) deferred: Option<(usize, Box<GemvSet>)>,
}

/// The streamed gate|up's blocks an SM (`LaunchOptions::gemv_stream`), and whether its 1-row
/// kernels stage a batch (`gemv_stream_stage`).
type StreamChoice = (Option<u8>, bool);

/// The 1-row streamed gate|up kernels that stage a batch (`kernels/gemv.cu` `*_st_*`) and the
/// shared memory they take.
pub(crate) struct StreamOne {
    /// SiLU*up alone and behind the norm.
    pub(super) fs: [CudaFunction; 2],
    /// Dynamic shared memory a block takes for its warps' stages, before the normed rows.
    pub(super) stage_bytes: usize,
}

/// Shared memory one warp's staged batch takes (`kernels/gemv_stream.cuh` `STAGE_BYTES`:
/// two rows of 8 chunks of 16 bytes for each of 32 lanes).
pub(super) const STAGE_BYTES: usize = 2 * 8 * 32 * 16;

/// The widest normed row a staged kernel may hold beside its stages (`STREAM_NORM_MAX_K`
/// bf16 of one row).
const STAGE_NORM_BYTES: usize = STREAM_NORM_MAX_K * 2;

impl GemvSet {
    /// The functions for 1..=`rows` rows that the launch options (`gemv_stream`,
    /// `gemv_double_buffer`, `gemv_split_k`, `warp_norm`, `norm_deferred`) ask for, from the
    /// loaded `gemv` module, for a GPU of `sms` SMs.
    pub(super) fn load(
        m: &Arc<CudaModule>,
        (gemv_stream, double, split, (warp_norm, deferred)): (
            StreamChoice,
            bool,
            bool,
            (bool, Option<usize>),
        ),
        sms: usize,
        rows: usize,
    ) -> Result<Self> {
        let which = (gemv_stream, double, split, warp_norm);
        let norm = if warp_norm { "wnorm" } else { "norm" };
        let mut set = Self::named(m, which, norm, sms, rows)?;
        if let Some(max_k) = deferred.filter(|_| !warp_norm) {
            let d = Self::named(m, which, "dnorm", sms, rows)?;
            set.deferred = Some((max_k, Box::new(d)));
        }
        Ok(set)
    }

    /// Asks every function of the set for the shared-memory carveout `c`
    /// (`LaunchOptions::smem_carveout`: they serve 1-2-row steps only).
    pub(super) fn carve(&self, c: u8) {
        let stream = self.stream.iter().flat_map(|(s, _)| s.iter().flatten());
        let stream = stream.chain(self.stream_one.iter().flat_map(|o| o.fs.iter()));
        let double = self.double.iter().flat_map(|d| d.iter().flatten());
        let split = self.split.iter().flatten();
        let fs = self
            .fs
            .iter()
            .flatten()
            .chain(stream)
            .chain(double)
            .chain(split);
        super::launch::carve(fs, c);
        if let Some((_, d)) = &self.deferred {
            d.carve(c);
        }
    }

    /// [`GemvSet::load`] with the norm kernels named `{norm}_*`.
    fn named(
        m: &Arc<CudaModule>,
        ((gemv_stream, stage), double, split, warp_norm): (StreamChoice, bool, bool, bool),
        norm: &str,
        sms: usize,
        rows: usize,
    ) -> Result<Self> {
        let all = |kind: String| -> Result<Vec<CudaFunction>> {
            (1..=rows)
                .map(|t| {
                    let name = format!("{kind}_t{t}_bf16");
                    m.load_function(&name)
                        .map_err(|e| kernel_err(&format!("function {name}"), e))
                })
                .collect()
        };
        Ok(Self {
            fs: [
                all("gemv".into())?,
                all("gemv_silu".into())?,
                all(format!("{norm}_gemv"))?,
                all(format!("{norm}_gemv_silu"))?,
            ],
            norm_smem: !warp_norm,
            // Only the gate|up kernels have streamed rows (the others measured slower on
            // them), and not beside the per-warp norm.
            stream: match gemv_stream.filter(|_| !warp_norm) {
                Some(b) => Some((
                    [
                        all("sgemv_silu".into())?,
                        all(format!("s{norm}_gemv_silu"))?,
                    ],
                    sms * usize::from(b),
                )),
                None => None,
            },
            stream_one: if gemv_stream.is_some() && !warp_norm && stage {
                Some(StreamOne::load(m, norm)?)
            } else {
                None
            },
            double: if double && !warp_norm {
                Some([all("gemv_db".into())?, all(format!("{norm}_gemv_db"))?])
            } else {
                None
            },
            split: if split {
                Some(all("gemv_split".into())?)
            } else {
                None
            },
            deferred: None,
        })
    }
}

impl StreamOne {
    /// The 1-row staged gate|up entries, norm kernel `s{norm}_*`.
    fn load(m: &Arc<CudaModule>, norm: &str) -> Result<Self> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute as A;
        let stage_bytes = GEMV_WARPS * STAGE_BYTES;
        let f = |name: String| -> Result<CudaFunction> {
            let func = m
                .load_function(&name)
                .map_err(|e| kernel_err(&format!("function {name}"), e))?;
            let smem = (stage_bytes + STAGE_NORM_BYTES) as i32;
            func.set_attribute(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
                .map_err(|e| kernel_err(&format!("{name} shared memory"), e))?;
            Ok(func)
        };
        Ok(Self {
            fs: [
                f("sgemv_silu_st_t1_bf16".into())?,
                f(format!("s{norm}_gemv_silu_st_t1_bf16"))?,
            ],
            stage_bytes,
        })
    }
}

/// One function per GQA group (1, 2, 4, 8) of module `m`: `{name}_g{G}_{dt}`.
pub(super) fn group_functions(
    m: &Arc<CudaModule>,
    name: &str,
    dt: &str,
) -> Result<[CudaFunction; 4]> {
    let f = |g: usize| {
        let name = format!("{name}_g{g}_{dt}");
        m.load_function(&name)
            .map_err(|e| kernel_err(&format!("function {name}"), e))
    };
    Ok([f(1)?, f(2)?, f(4)?, f(8)?])
}

/// The pinned buffer uploads go through, and the event after the copy that last read it.
#[derive(Default)]
pub(crate) struct Staging(
    pub(super) parking_lot::Mutex<Option<(PinnedHostSlice<u32>, Option<CudaEvent>)>>,
);

/// The verify attention of one compute dtype: GQA groups 1, 2 and 4 (group 8 has one row a
/// chunk: the decode kernel serves it), over caches of that dtype and over fp8 caches (bf16
/// only), and the merge of their partitions.
pub(super) struct SharedKv {
    pub(super) attend: [CudaFunction; 3],
    pub(super) attend_fp8: Option<[CudaFunction; 3]>,
    pub(super) reduce: CudaFunction,
}

/// The kernels of verify steps (`kernels/verify.cu`, launched by `verify.rs`), loaded with
/// the rest (`CudaKernels::new`).
pub(crate) struct SpecKernels {
    /// The shared-K/V attention (with `LaunchOptions::shared_kv_verify`).
    pub(super) shared: Option<SharedKv>,
    pub(super) accept: CudaFunction,
}

impl SpecKernels {
    /// The verify kernels of `module` (`kernels/verify.cu`) for `dtype` (`suffix` `bf16` or
    /// `f32`); the attention only when `shared` asks for it.
    pub(super) fn load(
        module: &Arc<CudaModule>,
        dtype: DType,
        suffix: &str,
        shared: bool,
    ) -> Result<Self> {
        let f = |name: String| {
            module
                .load_function(&name)
                .map_err(|e| kernel_err(&format!("function {name}"), e))
        };
        let groups = |dt: &str| -> Result<[CudaFunction; 3]> {
            Ok([
                f(format!("paged_verify_g1_{dt}"))?,
                f(format!("paged_verify_g2_{dt}"))?,
                f(format!("paged_verify_g4_{dt}"))?,
            ])
        };
        let shared = if shared {
            Some(SharedKv {
                attend: groups(suffix)?,
                attend_fp8: if dtype == DType::BF16 {
                    Some(groups("fp8")?)
                } else {
                    None
                },
                reduce: f(format!("paged_verify_reduce_{suffix}"))?,
            })
        } else {
            None
        };
        Ok(Self {
            accept: f("spec_accept".into())?,
            shared,
        })
    }
}

/// LoRA shrinks beside the base matmuls (`super::lora_overlap`): the second stream, its fork
/// and join events, and the expand+SiLU kernels (`kernels/lora_silu.cu`).
pub(super) struct LoraOverlap {
    pub(super) side: Arc<CudaStream>,
    pub(super) fork: CudaEvent,
    pub(super) join: CudaEvent,
    /// `lora_expand_silu` for ranks up to 16 and up to 64.
    pub(super) silu: [CudaFunction; 2],
    /// `lora_add_rmsnorm` (or `_pre`) for ranks up to 16 and up to 64.
    pub(super) norm: [CudaFunction; 2],
    /// The wide matmul's kernels (`LaunchOptions::lora_wide`): `lora_expand_silu_w`,
    /// `lora_add_rmsnorm_w` (or `_pre_w`) and `lora_wide_expand`, by rank as above.
    pub(super) wide: Option<[[CudaFunction; 2]; 3]>,
    /// Steps of at least this many rows take `wide`.
    pub(super) wide_min_rows: usize,
    /// Steps of more than this many rows shrink on `side`.
    pub(super) side_min_rows: usize,
    _module: Arc<CudaModule>,
}

impl LoraOverlap {
    /// The second stream forked from `main` and the kernels of `module`
    /// (`kernels/lora_silu.cu`) for dtype suffix `dt`, as `opts` choose them.
    pub(super) fn new(
        main: &Arc<CudaStream>,
        module: Arc<CudaModule>,
        dt: &str,
        opts: &super::LaunchOptions,
    ) -> Result<Self> {
        let pair = |name: &str| -> Result<[CudaFunction; 2]> {
            let f = |r: usize| {
                let name = format!("{name}_r{r}_{dt}");
                module
                    .load_function(&name)
                    .map_err(|e| kernel_err(&format!("function {name}"), e))
            };
            Ok([f(16)?, f(64)?])
        };
        let norm =
            ["lora_add_rmsnorm", "lora_add_rmsnorm_pre"][usize::from(opts.lora_norm_preload)];
        let wide = match opts.lora_wide {
            Some(_) => Some([
                pair("lora_expand_silu_w")?,
                pair(&format!("{norm}_w"))?,
                pair("lora_wide_expand")?,
            ]),
            None => None,
        };
        let side = main.fork().map_err(|e| kernel_err("lora stream", e))?;
        let ctx = main.context();
        let event = || ctx.new_event(None).map_err(|e| kernel_err("lora event", e));
        Ok(Self {
            side,
            fork: event()?,
            join: event()?,
            silu: pair("lora_expand_silu")?,
            norm: pair(norm)?,
            wide,
            wide_min_rows: opts.lora_wide.unwrap_or(usize::MAX),
            side_min_rows: opts.lora_side_min_rows,
            _module: module,
        })
    }
}

/// Counters of the grouped LoRA shrink's (rows, group) pairs (`super::lora_grouped_ops`): 12
/// row tiles (rank 64, three projections) x 64 groups at most.
pub(super) const LORA_GROUPED_COUNTERS: usize = 1024;

/// The grouped kernels and the split shrink's counters (zero between launches: the last
/// block of each pair resets its own).
pub(super) struct LoraGrouped {
    pub(super) shrink: CudaFunction,
    /// The expand for ranks up to 16 and up to 64.
    pub(super) expand: [CudaFunction; 2],
    pub(super) counters: Tensor,
    /// Slices the shrink is asked to take (0: its rule; profiling).
    pub(super) slices: std::sync::atomic::AtomicUsize,
    /// Every shrink and expand of a step they serve, not only the shrinks where they measured
    /// faster (profiling and checks).
    pub(super) everywhere: std::sync::atomic::AtomicBool,
    _module: Arc<CudaModule>,
}

impl LoraGrouped {
    /// The kernels of `module` (`kernels/lora_grouped.cu`, bf16; launched by
    /// `super::lora_grouped_ops`) and zeroed counters on `dev`.
    pub(super) fn new(module: Arc<CudaModule>, dev: &Device) -> Result<Self> {
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| kernel_err(&format!("function {name}"), e))
        };
        Ok(Self {
            shrink: f("lora_shrink_grouped_bf16")?,
            expand: [
                f("lora_expand_grouped_r16_bf16")?,
                f("lora_expand_grouped_r64_bf16")?,
            ],
            counters: Tensor::zeros(LORA_GROUPED_COUNTERS, DType::U32, dev)?,
            slices: std::sync::atomic::AtomicUsize::new(0),
            everywhere: std::sync::atomic::AtomicBool::new(false),
            _module: module,
        })
    }

    /// Whether the kernels take every shrink and expand of the steps they serve.
    pub(super) fn everywhere(&self) -> bool {
        self.everywhere.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The LoRA shrink that reads the tile table by runs (`super::lora_runs`,
/// `kernels/lora_runs.cu`).
pub(super) struct LoraRuns {
    pub(super) shrink: CudaFunction,
    _module: Arc<CudaModule>,
}

impl LoraRuns {
    /// The kernel of `module` for the dtype suffix `s` (`bf16`, `f32`).
    pub(super) fn new(module: Arc<CudaModule>, s: &str) -> Result<Self> {
        let name = format!("lora_shrink_runs_{s}");
        Ok(Self {
            shrink: module
                .load_function(&name)
                .map_err(|e| kernel_err(&format!("function {name}"), e))?,
            _module: module,
        })
    }
}
