//! The block timeline (the `timeline` feature: a profiling build whose kernels are compiled with
//! `BLOCK_TIMELINE`, `kernels/common.cuh`): thread 0 of each block of a kernel that calls
//! `pdl_trigger` then `pdl_wait` writes when the block started and when its wait on the kernel
//! before was released, with its SM and its grid. Each loaded module records into a buffer of
//! its own while armed ([`arm`]); [`Timeline::finish`] reads them back. Used by
//! `examples/graph_check --timeline` to see how the launches of a decode step overlap. The
//! records cost each block's thread 0 an atomic before its wait and 16 bytes of static shared
//! memory: timings shift a little, and a kernel sized to the shared-memory limit may not launch
//! in this build (the decode steps' kernels do).

use std::sync::{Arc, Mutex, Weak};

use candle_core::Device;
use candle_core::cuda_backend::cudarc::driver::{CudaModule, CudaSlice, CudaStream};

use crate::error::{Result, kernel_err};

/// Every module loaded by [`super::CudaKernels::new`] in this process, with its name (weak:
/// a module dropped with its kernels is gone from the timeline too).
static MODULES: Mutex<Vec<(String, Weak<CudaModule>)>> = Mutex::new(Vec::new());

/// Remembers a loaded module for [`arm`].
pub(super) fn register(name: &str, module: &Arc<CudaModule>) {
    if let Ok(mut m) = MODULES.lock() {
        m.retain(|(_, w)| w.strong_count() > 0);
        m.push((name.to_string(), Arc::downgrade(module)));
    }
}

/// One block's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRecord {
    /// The module (kernel file) of its kernel.
    pub module: String,
    /// `%globaltimer` (ns) at its start.
    pub start_ns: u64,
    /// `%globaltimer` (ns) once its wait on the kernel before was released.
    pub release_ns: u64,
    /// The SM it ran on.
    pub sm: u32,
    /// Its linear block index.
    pub block: u32,
    /// Its kernel's grid.
    pub grid: [u32; 3],
    /// Its kernel's threads a block.
    pub threads: u32,
    /// 0: the block's record (start, release); 1 and up: a phase its kernel marks
    /// (`TL_MARK` in `kernels/`), at `release_ns` (`start_ns` 0).
    pub phase: u8,
}

/// The armed buffers: one a module. Dropped without [`Timeline::finish`], it disarms the
/// modules (their kernels would otherwise go on writing into freed buffers).
pub struct Timeline {
    parts: Vec<(String, Arc<CudaModule>, CudaSlice<u64>)>,
    cap: usize,
    stream: Arc<CudaStream>,
}

fn set(m: &Arc<CudaModule>, stream: &Arc<CudaStream>, name: &str, bytes: &[u8]) -> Result<()> {
    let mut v = m.get_global(name, stream).map_err(|e| {
        kernel_err(
            &format!("timeline symbol {name} (built without the timeline feature?)"),
            e,
        )
    })?;
    stream
        .memcpy_htod(bytes, &mut v)
        .map_err(|e| kernel_err("timeline", e))
}

/// Arms every loaded module that has the timeline's symbols (a file that includes
/// `kernels/common.cuh`; `kv_move.cu` does not): from the next launch on, each records up to
/// `cap` blocks.
pub fn arm(dev: &Device, cap: usize) -> Result<Timeline> {
    let Device::Cuda(cd) = dev else {
        return Err(kernel_err("timeline", "not a CUDA device"));
    };
    let stream = cd.cuda_stream();
    let modules: Vec<(String, Arc<CudaModule>)> = MODULES
        .lock()
        .map(|m| {
            m.iter()
                .filter_map(|(n, w)| Some((n.clone(), w.upgrade()?)))
                .collect()
        })
        .unwrap_or_default();
    let mut parts = Vec::with_capacity(modules.len());
    for (name, m) in modules {
        if m.get_global("tl_buf", &stream).is_err() {
            continue;
        }
        let buf = stream
            .alloc_zeros::<u64>(cap * 4)
            .map_err(|e| kernel_err("timeline buffer", e))?;
        let ptr = {
            use candle_core::cuda_backend::cudarc::driver::DevicePtr;
            let (p, _sync) = buf.device_ptr(&stream);
            p
        };
        set(&m, &stream, "tl_buf", &ptr.to_le_bytes())?;
        set(&m, &stream, "tl_cap", &(cap as u32).to_le_bytes())?;
        set(&m, &stream, "tl_n", &0u32.to_le_bytes())?;
        parts.push((name, m, buf));
    }
    Ok(Timeline { parts, cap, stream })
}

impl Drop for Timeline {
    fn drop(&mut self) {
        for (_, m, _) in &self.parts {
            // Best effort: the buffers are freed after this, in stream order.
            let _ = set(m, &self.stream, "tl_buf", &0u64.to_le_bytes());
        }
    }
}

impl Timeline {
    /// Waits for the stream, disarms every module and returns the records written, in release
    /// order (a slot taken by a block that ended before its wait holds nothing and is left
    /// out), with the modules whose `cap` ran out.
    pub fn finish(self) -> Result<(Vec<BlockRecord>, Vec<String>)> {
        let s = &self.stream;
        s.synchronize().map_err(|e| kernel_err("timeline", e))?;
        let (mut out, mut full) = (Vec::new(), Vec::new());
        for (name, m, buf) in &self.parts {
            set(m, s, "tl_buf", &0u64.to_le_bytes())?;
            let n = {
                let v = m
                    .get_global("tl_n", s)
                    .map_err(|e| kernel_err("timeline symbol tl_n", e))?;
                let b = s.clone_dtoh(&v).map_err(|e| kernel_err("timeline", e))?;
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
            };
            if n > self.cap {
                full.push(name.clone());
            }
            let n = n.min(self.cap);
            if n == 0 {
                continue;
            }
            let words = s.clone_dtoh(buf).map_err(|e| kernel_err("timeline", e))?;
            for r in words[..4 * n].chunks_exact(4).filter(|r| r[1] != 0) {
                out.push(BlockRecord {
                    module: name.clone(),
                    start_ns: r[0],
                    release_ns: r[1],
                    sm: (r[2] >> 32) as u32,
                    block: r[2] as u32,
                    grid: [
                        (r[3] & 0xffff) as u32,
                        ((r[3] >> 16) & 0xff) as u32,
                        ((r[3] >> 24) & 0xff) as u32,
                    ],
                    threads: ((r[3] >> 32) & 0xff_ffff) as u32,
                    phase: if r[3] >> 63 == 1 {
                        ((r[3] >> 56) & 0x7f) as u8
                    } else {
                        0
                    },
                });
            }
        }
        out.sort_by_key(|r| r.release_ns);
        Ok((out, full))
    }
}
