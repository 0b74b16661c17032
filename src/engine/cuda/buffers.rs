//! Device memory for the kernels' outputs and scratch, raw pointers of candle tensors, and
//! timing events on the kernels' stream.

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::DevicePtr;
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, DType, Shape, Storage, Tensor};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::error::Result;

impl CudaKernels {
    /// The device pointer of a contiguous CUDA tensor's first element.
    pub(crate) fn ptr(&self, t: &Tensor) -> Result<u64> {
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
            CudaStorageSlice::U8(s) => (s.device_ptr(&self.stream).0, 1),
            _ => return Err(kernel_err("input", "unsupported dtype")),
        };
        Ok(base + (layout.start_offset() * size) as u64)
    }

    /// An uninitialized tensor (every element is written by the kernel that gets it).
    pub(crate) fn alloc(&self, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
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

    pub(super) fn check_dtype(&self, t: &Tensor) -> Result<()> {
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
