//! Token ids on their way to the host without waiting for the stream: a copy into pinned host
//! memory queued behind the kernels that compute them, and an event after it. Waiting on
//! the event returns as soon as those kernels are done, even when later work (the next
//! decode step, launched before these ids were read) is queued behind the copy; reading a
//! tensor the usual way (`to_vec1`) would wait for that too.
//!
//! Invariant: a pinned buffer goes back to the pool only after its copy completed (the
//! event was waited on), so no copy ever writes a buffer someone else holds.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaEvent, PinnedHostSlice, result, sys};
use candle_core::{DType, Tensor};

use super::kernels::{CudaKernels, PinnedPool};
use super::launch::kernel_err;
use crate::error::Result;

/// Least length of a pooled pinned buffer (u32 elements).
const MIN_PINNED: usize = 256;

/// u32 ids being copied to the host ([`CudaKernels::read_ids`]).
pub struct PendingIds {
    pool: Arc<PinnedPool>,
    /// Always `Some` until the ids are taken or the value dropped.
    buf: Option<PinnedHostSlice<u32>>,
    n: usize,
    done: CudaEvent,
}

impl CudaKernels {
    /// Queues a copy of u32 `ids` (`[n]`, contiguous) to the host behind the work queued so
    /// far; [`PendingIds::wait`] returns them once that work is done.
    pub fn read_ids(&self, ids: &Tensor) -> Result<PendingIds> {
        if ids.dtype() != DType::U32 {
            return Err(kernel_err("read ids", "ids must be u32"));
        }
        self.read_words(ids)
    }

    /// [`CudaKernels::read_ids`] for a contiguous f32 tensor: its values' bits as u32
    /// (`f32::from_bits` on the host).
    pub fn read_bits(&self, t: &Tensor) -> Result<PendingIds> {
        if !matches!(t.dtype(), DType::U32 | DType::F32) {
            return Err(kernel_err("read bits", "a u32 or f32 tensor is needed"));
        }
        self.read_words(t)
    }

    fn read_words(&self, ids: &Tensor) -> Result<PendingIds> {
        let n = ids.elem_count();
        let src = self.ptr(ids)?;
        let taken = {
            let mut pool = self.pinned.0.lock();
            pool.iter()
                .position(|b| b.len() >= n)
                .map(|i| pool.swap_remove(i))
        };
        let mut buf = match taken {
            Some(b) => b,
            // SAFETY: every element read back is written by the copy first.
            None => unsafe {
                self.stream
                    .context()
                    .alloc_pinned_with_flags::<u32>(n.max(MIN_PINNED), 0)
            }
            .map_err(|e| kernel_err("pinned buffer", e))?,
        };
        let done = self
            .stream
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| kernel_err("event", e))?;
        let dst = buf
            .as_mut_slice()
            .map_err(|e| kernel_err("pinned buffer", e))?;
        // SAFETY: `src` holds n u32 on this stream; `dst` has room for them and stays
        // allocated (and out of the pool) until `done` completed.
        unsafe { result::memcpy_dtoh_async(&mut dst[..n], src, self.stream.cu_stream()) }
            .map_err(|e| kernel_err("ids to host", e))?;
        if let Err(e) = done.record(&self.stream) {
            // Without the event, wait for the copy here before the buffer can be freed.
            let _ = self.stream.synchronize();
            return Err(kernel_err("event", e));
        }
        Ok(PendingIds {
            pool: self.pinned.clone(),
            buf: Some(buf),
            n,
            done,
        })
    }
}

impl PendingIds {
    /// Waits for the copy (and the kernels before it) and returns the ids.
    pub fn wait(mut self) -> Result<Vec<u32>> {
        self.done
            .synchronize()
            .map_err(|e| kernel_err("ids to host", e))?;
        let buf = self.buf.take().expect("ids not taken yet");
        // The copy has completed: the buffer may be read, dropped or pooled. (Its own event
        // is never recorded, copies here go through `result`, so `as_slice` returns at once.)
        let ids = buf.as_slice().map_err(|e| kernel_err("pinned buffer", e))?[..self.n].to_vec();
        self.pool.0.lock().push(buf);
        Ok(ids)
    }
}

impl Drop for PendingIds {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            // Never free or reuse a buffer a copy may still write.
            if self.done.synchronize().is_ok() {
                self.pool.0.lock().push(buf);
            } else {
                std::mem::forget(buf);
            }
        }
    }
}
