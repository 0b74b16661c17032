//! The engine's own CUDA kernels (`kernels/*.cu`, compiled by `build.rs` to fatbins with
//! sm_80/sm_90 machine code and embedded here), their launches on candle tensors, the forward
//! built from them (`forward.rs`), its matmuls (`gemm.rs`) and the decode steps captured as
//! CUDA graphs (`graph.rs`).
//!
//! Invariants: every launch goes on the device's one stream (candle's), reads and writes only
//! contiguous tensors it is given, and never synchronizes with the host; the `_into` variants
//! allocate nothing (they write buffers the caller owns), so a decode forward made of them can
//! be graph-captured. Every kernel waits on the one before it before it touches anything that
//! kernel may write (`launch.rs`). Only bf16 and f32 activations and head_dim 128 are served;
//! other models use the candle path.

mod attention;
mod forward;
mod gemm;
mod graph;
mod launch;
mod layer_ops;
mod readback;

pub use attention::{CLUSTER_MAX_ROWS, DECODE_CLUSTER, FUSED_MAX_ROWS};
pub use graph::DecodeGraphs;
pub use readback::PendingIds;

use std::sync::Arc;

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, CudaStream, DevicePtr};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Device, Shape, Storage, Tensor};

use crate::error::{Error, Result};

static ATTENTION: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/attention.fatbin"));
static LAYER_OPS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/layer_ops.fatbin"));
static GEMV: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gemv.fatbin"));

/// Most token rows the skinny-matmul kernels (`kernels/gemv.cu`) take: where they beat
/// cuBLAS on the H200 (at 3-8 rows cuBLAS wins; BENCHMARKS.md, "Decode steps as CUDA graphs").
pub const GEMV_MAX_ROWS: usize = 2;

/// Context tokens one decode-attention block takes at most in large batches (a partition of
/// flash-decoding); small batches take shorter partitions ([`CudaKernels::decode_partition`]).
const DECODE_PARTITION: usize = 256;

/// Query tokens one CUDA-core prefill-attention block takes (`BQ` in `kernels/attention.cu`).
const PREFILL_TILE: usize = 16;

fn kernel_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Engine(format!("CUDA kernel {what}: {e}"))
}

/// The kernels of one dtype, loaded on one device.
pub struct CudaKernels {
    device: CudaDevice,
    stream: Arc<CudaStream>,
    dtype: DType,
    _modules: [Arc<CudaModule>; 3],
    add_rmsnorm: CudaFunction,
    qk_rope_hd128: CudaFunction,
    qk_rope_hd64: CudaFunction,
    silu_mul: CudaFunction,
    argmax_f32: CudaFunction,
    argmax_merge: CudaFunction,
    topk_f32: CudaFunction,
    sample_topk: CudaFunction,
    gather_rows: CudaFunction,
    to_f32: CudaFunction,
    decode: [CudaFunction; 4],
    decode_reduce: CudaFunction,
    /// The fused decode attention (q/k norm + RoPE + KV write + attention + merge), bf16, GQA
    /// groups 1, 2, 4, 8; None for f32 or with `POLICY_SERVE_FUSED_DECODE=0`.
    decode_fused: Option<[CudaFunction; 4]>,
    prefill: [CudaFunction; 3],
    /// The tensor-core prefill kernels (bf16 only), for GQA groups 1, 2, 4, 8.
    prefill_tc: Option<[CudaFunction; 4]>,
    /// Skinny matmuls for 1..=GEMV_MAX_ROWS rows: plain, fused with SiLU*up, and both
    /// behind a fused add+RMSNorm (bf16 only; None when `POLICY_SERVE_GEMV=0`).
    gemv: Option<[Vec<CudaFunction>; 4]>,
    blas: gemm::Blas,
    /// Fused decode attention merges in thread-block clusters (sm_90+, unless
    /// `POLICY_SERVE_CLUSTERS=0`; see [`CudaKernels::decode_cluster`]).
    clusters: bool,
    /// Pinned host buffers for token ids read back without waiting for the stream.
    pinned: Arc<readback::PinnedPool>,
    /// Launch with programmatic dependent launch (sm_90+, unless `POLICY_SERVE_PDL=0`; in
    /// captured graphs too unless `POLICY_SERVE_GRAPH_PDL=0`).
    pdl: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for CudaKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKernels")
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl CudaKernels {
    /// Loads the kernels for `dtype` on `device`; `None` on the CPU or for a dtype the kernels
    /// do not serve (f16).
    pub fn new(device: &Device, dtype: DType) -> Result<Option<Self>> {
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
        let load = |bytes: &[u8], name: &str| {
            ctx.load_module(Ptx::from_binary(bytes.to_vec()))
                .map_err(|e| kernel_err(&format!("module {name}"), e))
        };
        let attention = load(ATTENTION, "attention")?;
        let layer_ops = load(LAYER_OPS, "layer_ops")?;
        let gemv_mod = load(GEMV, "gemv")?;
        let f = |m: &Arc<CudaModule>, name: &str| {
            m.load_function(name)
                .map_err(|e| kernel_err(&format!("function {name}"), e))
        };
        let s = suffix;
        let hopper = {
            use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute as A;
            ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
                .unwrap_or(0)
                >= 9
        };
        Ok(Some(Self {
            device: dev.clone(),
            dtype,
            add_rmsnorm: f(&layer_ops, &format!("add_rmsnorm_{s}"))?,
            qk_rope_hd128: f(&layer_ops, &format!("qk_norm_rope_kv_write_hd128_{s}"))?,
            qk_rope_hd64: f(&layer_ops, &format!("qk_norm_rope_kv_write_hd64_{s}"))?,
            silu_mul: f(&layer_ops, &format!("silu_mul_{s}"))?,
            argmax_f32: f(&layer_ops, "argmax_rows_f32")?,
            argmax_merge: f(&layer_ops, "argmax_merge")?,
            topk_f32: f(&layer_ops, "topk_rows_f32")?,
            sample_topk: f(&layer_ops, "sample_topk_f32")?,
            gather_rows: f(&layer_ops, &format!("gather_rows_{s}"))?,
            to_f32: f(&layer_ops, &format!("to_f32_{s}"))?,
            prefill: [
                f(&attention, &format!("paged_prefill_g1_{s}"))?,
                f(&attention, &format!("paged_prefill_g2_{s}"))?,
                f(&attention, &format!("paged_prefill_g4_{s}"))?,
            ],
            prefill_tc: if dtype == DType::BF16 {
                Some([
                    f(&attention, "paged_prefill_tc_g1_bf16")?,
                    f(&attention, "paged_prefill_tc_g2_bf16")?,
                    f(&attention, "paged_prefill_tc_g4_bf16")?,
                    f(&attention, "paged_prefill_tc_g8_bf16")?,
                ])
            } else {
                None
            },
            decode: [
                f(&attention, &format!("paged_decode_g1_{s}"))?,
                f(&attention, &format!("paged_decode_g2_{s}"))?,
                f(&attention, &format!("paged_decode_g4_{s}"))?,
                f(&attention, &format!("paged_decode_g8_{s}"))?,
            ],
            decode_reduce: f(&attention, &format!("paged_decode_reduce_{s}"))?,
            decode_fused: if dtype == DType::BF16
                && !std::env::var("POLICY_SERVE_FUSED_DECODE").is_ok_and(|v| v == "0")
            {
                let fs = [
                    f(&attention, "decode_fused_g1_bf16")?,
                    f(&attention, "decode_fused_g2_bf16")?,
                    f(&attention, "decode_fused_g4_bf16")?,
                    f(&attention, "decode_fused_g8_bf16")?,
                ];
                if hopper {
                    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute as A;
                    for func in &fs {
                        func.set_attribute(
                            A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                            1,
                        )
                        .map_err(|e| kernel_err("decode_fused cluster size", e))?;
                    }
                }
                Some(fs)
            } else {
                None
            },
            gemv: if dtype == DType::BF16
                && !std::env::var("POLICY_SERVE_GEMV").is_ok_and(|v| v == "0")
            {
                let all = |kind: &str| -> Result<Vec<CudaFunction>> {
                    (1..=GEMV_MAX_ROWS)
                        .map(|t| f(&gemv_mod, &format!("{kind}_t{t}_bf16")))
                        .collect()
                };
                Some([
                    all("gemv")?,
                    all("gemv_silu")?,
                    all("norm_gemv")?,
                    all("norm_gemv_silu")?,
                ])
            } else {
                None
            },
            blas: gemm::Blas::new(&stream)?,
            clusters: hopper && !std::env::var("POLICY_SERVE_CLUSTERS").is_ok_and(|v| v == "0"),
            pdl: std::sync::atomic::AtomicBool::new(
                hopper && !std::env::var("POLICY_SERVE_PDL").is_ok_and(|v| v == "0"),
            ),
            pinned: Arc::default(),
            stream,
            _modules: [attention, layer_ops, gemv_mod],
        }))
    }

    /// A launch of `f` on the kernels' stream (with programmatic dependent launch where the
    /// GPU has it).
    fn launcher<'a>(&'a self, f: &'a CudaFunction) -> launch::Launch<'a> {
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

    /// The device pointer of a contiguous CUDA tensor's first element.
    fn ptr(&self, t: &Tensor) -> Result<u64> {
        let (storage, layout) = t.storage_and_layout();
        if !layout.is_contiguous() {
            return Err(kernel_err("input", "a tensor is not contiguous"));
        }
        let Storage::Cuda(cs) = &*storage else {
            return Err(kernel_err("input", "a tensor is not on the GPU"));
        };
        let (base, size) = match &cs.slice {
            CudaStorageSlice::BF16(s) => (s.device_ptr(&self.stream).0, 2),
            CudaStorageSlice::F16(s) => (s.device_ptr(&self.stream).0, 2),
            CudaStorageSlice::F32(s) => (s.device_ptr(&self.stream).0, 4),
            CudaStorageSlice::U32(s) => (s.device_ptr(&self.stream).0, 4),
            _ => return Err(kernel_err("input", "unsupported dtype")),
        };
        Ok(base + (layout.start_offset() * size) as u64)
    }

    /// An uninitialized tensor (every element is written by the kernel that gets it).
    fn alloc(&self, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        let n = shape.elem_count().max(1);
        // SAFETY: the memory is written by the kernel it is allocated for before any read.
        let slice = unsafe {
            match dtype {
                DType::BF16 => CudaStorageSlice::BF16(self.device.alloc::<half::bf16>(n)?),
                DType::F32 => CudaStorageSlice::F32(self.device.alloc::<f32>(n)?),
                DType::U32 => CudaStorageSlice::U32(self.device.alloc::<u32>(n)?),
                DType::F16 => CudaStorageSlice::F16(self.device.alloc::<half::f16>(n)?),
                other => return Err(kernel_err("alloc", format!("dtype {other:?}"))),
            }
        };
        let storage = CudaStorage {
            slice,
            device: self.device.clone(),
        };
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            shape,
            BackpropOp::none(),
            false,
        ))
    }

    /// An output buffer of the activation dtype whose every element a kernel writes.
    pub(crate) fn alloc_out(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        self.alloc(shape, self.dtype)
    }

    fn check_dtype(&self, t: &Tensor) -> Result<()> {
        if t.dtype() != self.dtype {
            return Err(kernel_err(
                "input",
                format!("dtype {:?}, kernels loaded for {:?}", t.dtype(), self.dtype),
            ));
        }
        Ok(())
    }
}

/// A timing event recorded on the kernels' stream.
pub struct GpuEvent(candle_core::cuda_backend::cudarc::driver::CudaEvent);

impl GpuEvent {
    /// Milliseconds from `earlier` to this event (waits for both to complete).
    pub fn ms_since(&self, earlier: &GpuEvent) -> f64 {
        earlier.0.elapsed_ms(&self.0).map_or(0.0, f64::from)
    }
}

impl CudaKernels {
    /// Records a timing event on the stream now.
    pub fn event(&self) -> Result<GpuEvent> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
        let e = self
            .stream
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| kernel_err("event", e))?;
        e.record(&self.stream).map_err(|e| kernel_err("event", e))?;
        Ok(GpuEvent(e))
    }
}

impl CudaKernels {
    /// The kernels for a model, or `None` where the candle path serves it: not on CUDA, a
    /// dtype other than bf16/f32, a head_dim other than 128, q/k/v biases, or
    /// `POLICY_SERVE_KERNELS=0`.
    pub fn for_model(
        cfg: &super::ModelConfig,
        device: &Device,
        dtype: DType,
    ) -> Result<Option<Self>> {
        if std::env::var("POLICY_SERVE_KERNELS").is_ok_and(|v| v == "0") {
            tracing::info!("POLICY_SERVE_KERNELS=0: the forward runs candle ops");
            return Ok(None);
        }
        if cfg.head_dim() != 128 || cfg.attention_bias {
            return Ok(None);
        }
        Self::new(device, dtype)
    }
}
