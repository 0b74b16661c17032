//! [`CudaKernels`]: the kernels of one dtype loaded on one device (the fatbins `build.rs`
//! compiles from `kernels/*.cu`, embedded here), with the buffers and handles their launches
//! share. The launches themselves are `impl CudaKernels` blocks by family, in the files beside
//! this one.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, PinnedHostSlice,
};
use candle_core::{CudaDevice, DType, Device};

use super::attention_handles::{DecodeAttention, Fp8Kernels, FusedDecode};
use super::blas::Blas;
use super::handles::{GemvSet, LoraGrouped, SpecKernels, group_functions};
use super::launch::{self, kernel_err};
pub use super::launch_options::LaunchOptions;
use super::moe_handles::MoeKernels;
use crate::error::Result;

static DECODE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/decode.fatbin"));
static DECODE_MMA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/decode_mma.fatbin"));
static PREFILL: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/prefill.fatbin"));
static FLASH_PREFILL: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/flash_prefill.fatbin"));
static FLASH_PREFILL_SM90: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/flash_prefill_sm90.fatbin"));
static LAYER_OPS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/layer_ops.fatbin"));
static KV_WRITE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kv_write.fatbin"));
static LOGIT_EDITS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/logit_edits.fatbin"));
static LORA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lora.fatbin"));
static LORA_SILU: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lora_silu.fatbin"));
static LORA_GROUPED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lora_grouped.fatbin"));
static LORA_RUNS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lora_runs.fatbin"));
static MOE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/moe.fatbin"));
static MOE_MMA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/moe_mma.fatbin"));
static MOE_ROUTE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/moe_route.fatbin"));
static MOE_ROUTER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/moe_router.fatbin"));
static VERIFY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/verify.fatbin"));

/// Most token rows the CUDA-core skinny-matmul kernels (`kernels/gemv.cu`) take: where they
/// beat cuBLAS on the H200 (at 3-8 rows their FMAs bound them; BENCHMARKS.md, "Decode steps
/// as CUDA graphs").
pub const GEMV_MAX_ROWS: usize = 2;
/// Most token rows the tensor-core skinny-matmul kernels (`kernels/gemv_mma.cu`, from
/// `GEMV_MAX_ROWS + 1` rows, `LaunchOptions::gemv_mma`) take: one MMA's 8 columns.
pub const GEMV_MMA_MAX_ROWS: usize = 8;

/// Context tokens one decode-attention block takes at most in large batches (a partition of
/// flash-decoding); small batches take shorter partitions ([`CudaKernels::decode_partition`]).
pub(crate) const DECODE_PARTITION: usize = 256;

/// Query tokens one CUDA-core prefill-attention block takes (`BQ` in `kernels/prefill.cu`).
pub(crate) const PREFILL_TILE: usize = 16;
/// Dynamic shared memory of a 64-row flash prefill block (`flash_smem_bytes<64>()` in
/// `kernels/flash.cuh`: the Q tile and two 64-key K and V tiles of 128 bf16 dims, plus 1 KB to
/// align them to 1024 bytes).
pub(crate) const FLASH_PREFILL_SMEM: usize = 82944;
/// The same for the 128-row blocks of the warpgroup-MMA kernel (`flash_smem_bytes<128>()`).
pub(crate) const FLASH_PREFILL_SMEM_SM90: usize = 99328;

/// Pinned host buffers for [`CudaKernels::read_ids`], reused across steps.
#[derive(Default)]
pub(crate) struct PinnedPool(pub(super) parking_lot::Mutex<Vec<PinnedHostSlice<u32>>>);

/// The kernels of one dtype, loaded on one device.
pub struct CudaKernels {
    pub(super) device: CudaDevice,
    pub(super) stream: Arc<CudaStream>,
    pub(super) dtype: DType,
    pub(super) _modules: [Arc<CudaModule>; 7],
    pub(super) add_rmsnorm: CudaFunction,
    pub(super) qk_rope_hd128: CudaFunction,
    pub(super) silu_mul: CudaFunction,
    pub(super) argmax_f32: CudaFunction,
    pub(super) argmax_merge: CudaFunction,
    pub(super) topk_f32: CudaFunction,
    pub(super) logprob_rows: CudaFunction,
    pub(super) repetition_penalty: CudaFunction,
    pub(super) mask_tokens: CudaFunction,
    /// LoRA shrink and expand (`kernels/lora.cu`), for tiles of one token and of
    /// [`super::LORA_TILE`].
    pub(super) lora: [[CudaFunction; 2]; 2],
    /// LoRA steps with the shrinks beside the base matmuls (`LaunchOptions::lora_overlap`):
    /// the second stream and the gate|up expand with the SiLU (`kernels/lora_silu.cu`, ranks
    /// up to 16 and up to 64); None without the option.
    pub(super) lora_overlap: Option<super::handles::LoraOverlap>,
    /// The grouped LoRA kernels (`LaunchOptions::lora_grouped`, bf16); None without them.
    pub(super) lora_grouped: Option<LoraGrouped>,
    /// The LoRA shrink that reads the tile table by runs (`LaunchOptions::lora_runs`); None
    /// without it.
    pub(super) lora_runs: Option<super::handles::LoraRuns>,
    pub(super) gather_rows_f32: CudaFunction,
    /// The MoE layers' kernels (`kernels/moe_route.cu`, `moe_router.cu`, `moe.cu`, `moe_mma.cu`).
    pub(super) moe: MoeKernels,
    pub(super) sample_topk: CudaFunction,
    pub(super) sample_full: CudaFunction,
    pub(super) gather_rows: CudaFunction,
    pub(super) to_f32: CudaFunction,
    /// `to_f32` with each row's argmax (`LaunchOptions::graph_argmax`), when asked for.
    pub(super) to_f32_argmax: Option<CudaFunction>,
    /// The graphs' argmax writes their input ids too (`LaunchOptions::graph_feed`).
    pub(super) graph_feed: bool,
    /// The decode attention over caches of the compute dtype (`kernels/decode.cu`,
    /// `kernels/decode_mma.cu`).
    pub(super) decode: DecodeAttention,
    pub(super) decode_reduce: CudaFunction,
    /// The kernels of speculative verify steps (`kernels/verify.cu`).
    pub(super) spec: SpecKernels,
    /// The fused decode attention (q/k norm + RoPE + KV write + attention + merge), bf16, GQA
    /// groups 1, 2, 4, 8; None for f32 or without `LaunchOptions::fused_decode`.
    pub(super) decode_fused: Option<FusedDecode>,
    pub(super) prefill: [CudaFunction; 3],
    /// The tensor-core prefill kernels (bf16 only), for GQA groups 1, 2, 4, 8.
    pub(super) prefill_tc: Option<[CudaFunction; 4]>,
    /// The flash prefill kernels (bf16, `LaunchOptions::flash_prefill`), for GQA groups 1, 2,
    /// 4, 8.
    pub(super) prefill_flash: Option<[CudaFunction; 4]>,
    /// Whether `prefill_flash` is the warpgroup-MMA kernel (128-row blocks of 256 threads).
    pub(super) prefill_wgmma: bool,
    /// The merge of split-KV partials of the warpgroup-MMA prefill, GQA groups 1, 2, 4, 8.
    pub(super) prefill_merge: Option<[CudaFunction; 4]>,
    /// Streaming multiprocessors of the GPU.
    pub(super) sms: usize,
    /// The streamed 1-row matmul (`LaunchOptions::gemv_tma`, bf16, sm_90); None without.
    pub(super) gemv_tma: Option<super::handles::TmaGemv>,
    /// Skinny matmuls for 1..=GEMV_MAX_ROWS rows (bf16 only; None without
    /// `LaunchOptions::gemv`).
    pub(super) gemv: Option<GemvSet>,
    /// The same four on tensor cores for `GEMV_MAX_ROWS + 1..=GEMV_MMA_MAX_ROWS` rows (None
    /// without `LaunchOptions::gemv_mma`).
    pub(super) gemv_mma: Option<[Vec<CudaFunction>; 4]>,
    /// With `gemv_mma` loaded for `LaunchOptions::gemv_mma_plain`: the largest weight (rows x
    /// inputs) its plain and SiLU kernels take (the norm kinds go to cuBLAS or these behind a
    /// separate norm).
    pub(super) gemv_mma_plain: Option<usize>,
    /// With `gemv_mma` and `LaunchOptions::norm_presum`: the presummed norm's kernels for
    /// `GEMV_MAX_ROWS + 1..=GEMV_MMA_MAX_ROWS` rows (`gemm_presum.rs`): the matmul that adds
    /// to the residual, and plain and SiLU behind the norm.
    pub(super) gemv_presum: Option<[Vec<CudaFunction>; 3]>,
    /// Whether the skinny matmuls prefetch the next matmul's weights into L2.
    pub(super) l2_prefetch: bool,
    /// Which second builds of the skinny matmuls were loaded (`super::builds::Builds`).
    pub(super) builds: super::builds::Picked,
    /// Whether whole-vocabulary draws run on the device (`LaunchOptions::sample_full`).
    pub(super) sample_full_on: bool,
    pub(crate) blas: Blas,
    /// Fused decode attention merges in thread-block clusters (sm_90+ with
    /// `LaunchOptions::clusters`; see [`CudaKernels::decode_cluster`]).
    pub(super) clusters: bool,
    /// GQA group 8 fused as two group-4 halves a KV head (`LaunchOptions::gqa8_split`).
    pub(super) gqa8_split: bool,
    /// Decode attention partitions of the 1-row, 3-4-row and 5-16-row graph buckets
    /// (`LaunchOptions::graph_splits_one`, `graph_splits_few`, `graph_splits_mid`).
    pub(super) graph_splits: crate::engine::batch::SmallSplits,
    /// Eager decode steps take their graph bucket's partitions at most
    /// (`LaunchOptions::eager_graph_splits`).
    pub(super) eager_graph_splits: bool,
    /// cuBLAS matmuls on their row class's algorithm (`LaunchOptions::blas_row_class`).
    pub(super) blas_row_class: bool,
    /// Pinned host buffers for token ids read back without waiting for the stream.
    pub(crate) pinned: Arc<PinnedPool>,
    /// The pinned buffer host data goes through to the device ([`CudaKernels::upload_u32`]).
    pub(super) staging: super::handles::Staging,
    /// Row indices `0..len` on the device ([`CudaKernels::row_ids`]), grown on demand.
    pub(super) row_ids: parking_lot::Mutex<Option<candle_core::Tensor>>,
    /// Launch with programmatic dependent launch (sm_90+ with `LaunchOptions::pdl`; the graph
    /// capture sets it for its own launches).
    pub(super) pdl: std::sync::atomic::AtomicBool,
    /// `LaunchOptions::fused_long_ctx`.
    pub(super) fused_long_ctx: Option<usize>,
    /// `LaunchOptions::fused_long_ctx_one`.
    pub(super) fused_long_ctx_one: Option<usize>,
    /// `LaunchOptions::fused_long_ctx_many`.
    pub(super) fused_long_ctx_many: Option<usize>,
    /// `LaunchOptions::fused_max_rows`.
    pub(super) fused_max_rows: usize,
    /// The kernels over fp8 KV caches (bf16 compute on sm_89+), or why there are none.
    pub(super) fp8: std::result::Result<Fp8Kernels, String>,
}

impl std::fmt::Debug for CudaKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKernels")
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl CudaKernels {
    /// Loads the kernels for `dtype` on `device`, taking the launch paths `opts` allows;
    /// `None` on the CPU or for a dtype the kernels do not serve (f16).
    pub fn new(device: &Device, dtype: DType, opts: &LaunchOptions) -> Result<Option<Self>> {
        let Device::Cuda(dev) = device else {
            return Ok(None);
        };
        let suffix = match dtype {
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            _ => return Ok(None),
        };
        let stream = dev.cuda_stream();
        let ctx = stream.context().clone();
        let load = |bytes: &[u8], name: &str| launch::load_module(&ctx, bytes, name);
        let (major, minor) = {
            use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute as A;
            (
                ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
                    .unwrap_or(0),
                ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
                    .unwrap_or(0),
            )
        };
        // Clusters and PDL from sm_90 on; the sm_90a machine code (wgmma) on sm_90 only.
        let hopper = major >= 9;
        let sms = {
            use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute as A;
            ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .unwrap_or(1)
                .max(1) as usize
        };
        let wgmma = (major, minor) == (9, 0) && opts.wgmma_prefill;
        let decode_mod = load(DECODE, "decode")?;
        let mma_mod = load(DECODE_MMA, "decode_mma")?;
        let builds = super::builds::Builds::pick(opts);
        let fused_mod = load(builds.fused_decode, "fused_decode")?;
        let prefill_mod = load(PREFILL, "prefill")?;
        let flash_mod = if wgmma {
            load(FLASH_PREFILL_SM90, "flash_prefill_sm90")?
        } else {
            load(FLASH_PREFILL, "flash_prefill")?
        };
        let flash = match (wgmma, opts.wgmma_prefill_x2) {
            (true, false) => "flash_prefill_sm90",
            (true, true) => "flash_prefill_sm90_x2",
            _ => "flash_prefill",
        };
        let layer_ops = load(LAYER_OPS, "layer_ops")?;
        let kv_write = load(KV_WRITE, "kv_write")?;
        let logit_edits = load(LOGIT_EDITS, "logit_edits")?;
        let gemv_mod = load(builds.gemv, "gemv")?;
        let lora_mod = load(LORA, "lora")?;
        let moe_mod = load(MOE, "moe")?;
        let moe_mma_mod = load(MOE_MMA, "moe_mma")?;
        let moe_route_mod = load(MOE_ROUTE, "moe_route")?;
        let moe_router_mod = load(MOE_ROUTER, "moe_router")?;
        let f = |m: &Arc<CudaModule>, name: &str| {
            m.load_function(name)
                .map_err(|e| kernel_err(&format!("function {name}"), e))
        };
        // The tensor-core skinny matmuls (`gemv_mma.cu`) for 3-8 rows, with `gemv_mma` or
        // `gemv_mma_plain`; a set is one kind's kernels for each row count.
        let gemv_mma_mod = if dtype == DType::BF16
            && opts.gemv
            && (opts.gemv_mma || opts.gemv_mma_plain.is_some())
        {
            Some(load(builds.gemv_mma, "gemv_mma")?)
        } else {
            None
        };
        let mma_set = |m: &Arc<CudaModule>, kind: &str| -> Result<Vec<CudaFunction>> {
            (GEMV_MAX_ROWS + 1..=GEMV_MMA_MAX_ROWS)
                .map(|t| f(m, &format!("{kind}_t{t}_bf16")))
                .collect()
        };
        let s = suffix;
        let flash_on = dtype == DType::BF16 && opts.flash_prefill;
        let mma_decode = |dt: &str| DecodeAttention::load_mma(&mma_mod, opts, dtype, dt);
        let smem_attr = |fs: &[CudaFunction; 4]| -> Result<()> {
            use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute as A;
            let smem = if wgmma {
                FLASH_PREFILL_SMEM_SM90
            } else {
                FLASH_PREFILL_SMEM
            };
            for func in fs {
                func.set_attribute(
                    A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .map_err(|e| kernel_err("flash_prefill shared memory", e))?;
            }
            Ok(())
        };
        let fused_decode = |dt: &str| FusedDecode::load(&fused_mod, opts, dt, hopper);
        // fp8 KV: e4m3 conversions in hardware from sm_89, bf16 compute, the flash prefill.
        let fp8 = if dtype != DType::BF16 {
            Err(format!("fp8 KV needs bf16 compute, not {dtype:?}"))
        } else if (major, minor) < (8, 9) {
            Err(format!(
                "fp8 KV needs a GPU with fp8 (compute capability 8.9+); this one is {major}.{minor}"
            ))
        } else if !flash_on {
            Err("fp8 KV needs the flash prefill kernels (drop --no-flash-prefill)".to_string())
        } else {
            // One warpgroup-MMA block per SM: two spill (see flash_prefill_sm90.cu).
            let flash_fp8 = if wgmma {
                "flash_prefill_sm90"
            } else {
                "flash_prefill"
            };
            let prefill_flash = group_functions(&flash_mod, flash_fp8, "fp8")?;
            smem_attr(&prefill_flash)?;
            Ok(Fp8Kernels {
                kv_write: f(&kv_write, "qk_norm_rope_kv_write_hd128_fp8")?,
                decode: DecodeAttention {
                    cores: group_functions(&decode_mod, "paged_decode", "fp8")?,
                    mma: mma_decode("fp8")?,
                },
                decode_fused: if opts.fused_decode {
                    Some(fused_decode("fp8")?)
                } else {
                    None
                },
                prefill_flash,
            })
        };
        Ok(Some(Self {
            device: dev.clone(),
            dtype,
            add_rmsnorm: f(&layer_ops, &format!("add_rmsnorm_{s}"))?,
            qk_rope_hd128: f(&kv_write, &format!("qk_norm_rope_kv_write_hd128_{s}"))?,
            silu_mul: f(&layer_ops, &format!("silu_mul_{s}"))?,
            argmax_f32: f(&layer_ops, "argmax_rows_f32")?,
            argmax_merge: f(&layer_ops, "argmax_merge")?,
            topk_f32: f(&layer_ops, "topk_rows_f32")?,
            logprob_rows: f(&layer_ops, "logprob_rows_f32")?,
            repetition_penalty: f(&logit_edits, "repetition_penalty_f32")?,
            mask_tokens: f(&logit_edits, "mask_tokens_f32")?,
            lora: [
                [
                    f(&lora_mod, &format!("lora_shrink_t1_{s}"))?,
                    f(&lora_mod, &format!("lora_expand_t1_{s}"))?,
                ],
                [
                    f(&lora_mod, &format!("lora_shrink_t8_{s}"))?,
                    f(&lora_mod, &format!("lora_expand_t8_{s}"))?,
                ],
            ],
            lora_overlap: if opts.lora_overlap {
                let m = load(LORA_SILU, "lora_silu")?;
                Some(super::handles::LoraOverlap::new(&stream, m, s, opts)?)
            } else {
                None
            },
            lora_grouped: (opts.lora_grouped && dtype == DType::BF16)
                .then(|| LoraGrouped::new(load(LORA_GROUPED, "lora_grouped")?, device))
                .transpose()?,
            lora_runs: opts
                .lora_runs
                .then(|| super::handles::LoraRuns::new(load(LORA_RUNS, "lora_runs")?, s))
                .transpose()?,
            gather_rows_f32: f(&layer_ops, "gather_rows_f32")?,
            moe: MoeKernels::load(
                [&moe_route_mod, &moe_router_mod, &moe_mod, &moe_mma_mod],
                (opts, dtype == DType::BF16),
                |m, name| f(m, name),
            )?,
            sample_topk: f(&layer_ops, "sample_topk_f32")?,
            sample_full: f(&layer_ops, "sample_full_f32")?,
            gather_rows: f(&layer_ops, &format!("gather_rows_{s}"))?,
            to_f32: f(&layer_ops, &format!("to_f32_{s}"))?,
            to_f32_argmax: (opts.graph_argmax)
                .then(|| f(&layer_ops, &format!("to_f32_argmax_{s}")))
                .transpose()?,
            graph_feed: opts.graph_argmax && opts.graph_feed,
            prefill: [
                f(&prefill_mod, &format!("paged_prefill_g1_{s}"))?,
                f(&prefill_mod, &format!("paged_prefill_g2_{s}"))?,
                f(&prefill_mod, &format!("paged_prefill_g4_{s}"))?,
            ],
            prefill_tc: if dtype == DType::BF16 {
                Some(group_functions(&prefill_mod, "paged_prefill_tc", "bf16")?)
            } else {
                None
            },
            prefill_flash: if flash_on {
                let fs = group_functions(&flash_mod, flash, "bf16")?;
                smem_attr(&fs)?;
                Some(fs)
            } else {
                None
            },
            prefill_wgmma: wgmma && flash_on,
            prefill_merge: if wgmma && flash_on && opts.split_kv {
                Some(group_functions(&flash_mod, "flash_merge", "bf16")?)
            } else {
                None
            },
            sms,
            decode: DecodeAttention {
                cores: group_functions(&decode_mod, "paged_decode", s)?,
                mma: mma_decode(s)?,
            },
            decode_reduce: f(&decode_mod, &format!("paged_decode_reduce_{s}"))?,
            spec: SpecKernels::load(&load(VERIFY, "verify")?, dtype, s, opts.shared_kv_verify)?,
            decode_fused: if dtype == DType::BF16 && opts.fused_decode {
                Some(fused_decode("bf16")?)
            } else {
                None
            },
            gemv: if dtype == DType::BF16 && opts.gemv {
                let which = (
                    (opts.gemv_stream, opts.gemv_stream_stage),
                    opts.gemv_double_buffer,
                    opts.gemv_split_k,
                    (opts.warp_norm, opts.norm_deferred),
                );
                let set = GemvSet::load(&gemv_mod, which, sms, GEMV_MAX_ROWS)?;
                if let Some(c) = opts.smem_carveout {
                    set.carve(c);
                }
                Some(set)
            } else {
                None
            },
            sample_full_on: opts.sample_full,
            gemv_mma_plain: opts.gemv_mma_plain.filter(|_| !opts.gemv_mma),
            gemv_mma: match &gemv_mma_mod {
                Some(m) => Some([
                    mma_set(m, "mma_gemv")?,
                    mma_set(m, "mma_gemv_silu")?,
                    mma_set(m, "mma_norm_gemv")?,
                    mma_set(m, "mma_norm_gemv_silu")?,
                ]),
                None => None,
            },
            gemv_presum: match &gemv_mma_mod {
                Some(m) if opts.norm_presum => Some([
                    mma_set(m, "mma_gemv_res")?,
                    mma_set(m, "mma_gemv_pre")?,
                    mma_set(m, "mma_gemv_pre_silu")?,
                ]),
                _ => None,
            },
            l2_prefetch: hopper && opts.l2_prefetch,
            builds: builds.picked,
            gemv_tma: super::handles::TmaGemv::load(opts, (dtype, major == 9), &load)?,
            blas: Blas::new(&stream)?,
            clusters: hopper && opts.clusters,
            gqa8_split: opts.gqa8_split,
            graph_splits: crate::engine::batch::SmallSplits {
                one: opts.graph_splits_one,
                few: opts.graph_splits_few,
                mid: opts.graph_splits_mid,
            },
            eager_graph_splits: opts.eager_graph_splits,
            blas_row_class: opts.blas_row_class,
            pdl: std::sync::atomic::AtomicBool::new(hopper && opts.pdl),
            fused_long_ctx: opts.fused_long_ctx,
            fused_long_ctx_one: opts.fused_long_ctx_one,
            fused_long_ctx_many: opts.fused_long_ctx_many,
            // Eager steps choose by their rows, graph replays by their bucket's.
            fused_max_rows: crate::engine::batch::bucket_bound(opts.fused_max_rows),
            fp8,
            pinned: Arc::default(),
            staging: Default::default(),
            row_ids: Default::default(),
            stream,
            _modules: [
                decode_mod,
                fused_mod,
                prefill_mod,
                flash_mod,
                layer_ops,
                kv_write,
                gemv_mod,
            ],
        }))
    }

    /// A launch of `f` on the kernels' stream (with programmatic dependent launch where the
    /// GPU has it).
    pub(super) fn launcher<'a>(&'a self, f: &'a CudaFunction) -> launch::Launch<'a> {
        let pdl = self.pdl.load(std::sync::atomic::Ordering::Relaxed);
        launch::Launch::new(&self.stream, f, pdl)
    }

    /// Turns programmatic dependent launch off (or back on, where the GPU has it); returns
    /// whether it was on.
    pub(crate) fn set_pdl(&self, on: bool) -> bool {
        self.pdl.swap(on, std::sync::atomic::Ordering::Relaxed)
    }

    /// The activation dtype these kernels serve.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The stream every launch goes on (candle's).
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}
