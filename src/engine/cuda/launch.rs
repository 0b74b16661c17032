//! Kernel launches with programmatic dependent launch (PDL, Hopper), and optionally in
//! thread-block clusters: a kernel may be launched while the one before it on the stream
//! still runs (every kernel lets the next launch at its start, `pdl_trigger` in
//! `kernels/common.cuh`); its blocks wait (`pdl_wait`, `griddepcontrol.wait`) until that
//! kernel has finished and its writes are visible. Launch latency, block scheduling and the
//! reads placed before the wait overlap the previous kernel, in eager steps and in captured
//! graphs alike.
//!
//! Invariant: before its wait a kernel launched here reads only memory that no kernel of the
//! step writes — weights (the skinny matmuls), the step's uploaded inputs and K/V rows of
//! earlier steps (the fused decode attention) — and writes nothing; every other kernel waits
//! first (`pdl_entry`). So the attribute never lets a kernel see a half-written buffer. On
//! GPUs before sm_90 the instructions compile to nothing and no attribute is set.

use std::ffi::c_void;
use std::marker::PhantomData;

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DriverError, LaunchConfig, sys,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;

use crate::error::Error;

/// The arguments of one launch (each a reference to a value that outlives the launch).
pub(crate) struct Launch<'a> {
    func: sys::CUfunction,
    stream: &'a CudaStream,
    pdl: bool,
    /// Blocks per thread-block cluster along the grid's z (1: no clusters).
    cluster_z: u32,
    args: Vec<*mut c_void>,
    _values: PhantomData<&'a ()>,
}

impl<'a> Launch<'a> {
    pub(crate) fn new(stream: &'a CudaStream, func: &'a CudaFunction, pdl: bool) -> Self {
        Self {
            func: func.cu_function(),
            stream,
            pdl,
            cluster_z: 1,
            args: Vec::with_capacity(12),
            _values: PhantomData,
        }
    }

    /// Launches in thread-block clusters of `c` blocks along the grid's z (sm_90; `c` must
    /// divide the grid's z and be at most 8, or 16 for a function allowed non-portable
    /// cluster sizes).
    pub(crate) fn cluster_z(&mut self, c: u32) -> &mut Self {
        self.cluster_z = c;
        self
    }

    /// Appends an argument (a device pointer as `u64`, or a scalar).
    pub(crate) fn arg<T>(&mut self, v: &'a T) -> &mut Self {
        self.args.push(v as *const T as *mut c_void);
        self
    }

    /// Launches on the stream.
    ///
    /// # Safety
    /// The arguments must match the kernel's signature in number, order and type, and the
    /// buffers they point to must be live and large enough for `cfg`.
    pub(crate) unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        // SAFETY: the union is plain data; a zeroed attribute is then given its id and value.
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        let mut n = 0;
        if self.pdl {
            attrs[n].id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n].value.programmaticStreamSerializationAllowed = 1;
            n += 1;
        }
        if self.cluster_z > 1 {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[n].value.clusterDim.x = 1;
            attrs[n].value.clusterDim.y = 1;
            attrs[n].value.clusterDim.z = self.cluster_z;
            n += 1;
        }
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: n as u32,
        };
        // SAFETY: the caller vouches for the arguments; `attrs` and the argument values live
        // until this call returns (the driver copies them).
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.func,
                self.args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
        }
    }
}

/// Asks each of `fs` for the shared-memory carveout `c` (percent of the SM's unified L1 /
/// shared memory; `LaunchOptions::smem_carveout`). A hint: where the driver refuses it, the
/// kernel keeps the driver's choice and the refusal is logged.
pub(crate) fn carve<'a>(fs: impl IntoIterator<Item = &'a CudaFunction>, c: u8) {
    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT;
    for f in fs {
        if let Err(e) = f.set_attribute(attr, i32::from(c.min(100))) {
            tracing::warn!("shared-memory carveout {c}% not taken by a kernel: {e}");
        }
    }
}

/// Loads the module of an embedded fatbin (`name`: its kernel file, for errors); with the
/// `timeline` feature also registers it for the block timeline.
pub(super) fn load_module(
    ctx: &Arc<CudaContext>,
    bytes: &[u8],
    name: &str,
) -> Result<Arc<CudaModule>, Error> {
    let m = ctx
        .load_module(Ptx::from_binary(bytes.to_vec()))
        .map_err(|e| kernel_err(&format!("module {name}"), e))?;
    #[cfg(feature = "timeline")]
    super::timeline::register(name, &m);
    Ok(m)
}

/// An engine error naming the kernel step that failed.
pub(crate) use crate::error::kernel_err;
