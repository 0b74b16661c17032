//! Host data for a step's kernels through pinned memory: a copy from pageable memory of more
//! than a few KB makes the host wait for everything queued on the stream (the driver stages
//! it only once the stream reaches it), which would stall the host behind a step's forward;
//! from pinned memory the copy is queued like a kernel and the host goes on.
//!
//! Invariant: the staging buffer is written only after the copy that last read it completed
//! (its event was waited on), and freed only then.

use candle_core::cuda_backend::cudarc::driver::{result, sys};
use candle_core::{DType, Tensor};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::error::Result;

/// Least length of the staging buffer (u32 elements: 256 KB).
const MIN_STAGING: usize = 1 << 16;

impl CudaKernels {
    /// `words` in a new device tensor (u32 `[n]`), copied from pinned memory behind the work
    /// queued so far: the host waits neither for that work nor for the copy (only, when it
    /// uploads again, for this copy to have read the buffer).
    pub fn upload_u32(&self, words: &[u32]) -> Result<Tensor> {
        let n = words.len();
        let out = self.alloc((n,), DType::U32)?;
        if n == 0 {
            return Ok(out);
        }
        let mut slot = self.staging.0.lock();
        if let Some((_, Some(read))) = slot.as_ref() {
            read.synchronize()
                .map_err(|e| kernel_err("upload staging", e))?;
        }
        if slot.as_ref().is_none_or(|(b, _)| b.len() < n) {
            // The last copy out of the old buffer is done: it may be freed.
            *slot = None;
            // SAFETY: the buffer's elements are written below before any copy reads them.
            let buf = unsafe {
                self.stream
                    .context()
                    .alloc_pinned_with_flags::<u32>(n.max(MIN_STAGING), 0)
            }
            .map_err(|e| kernel_err("upload staging", e))?;
            *slot = Some((buf, None));
        }
        let Some((buf, read)) = slot.as_mut() else {
            return Err(kernel_err("upload staging", "no buffer"));
        };
        *read = None;
        let host = buf
            .as_mut_slice()
            .map_err(|e| kernel_err("upload staging", e))?;
        host[..n].copy_from_slice(words);
        let dst = self.ptr(&out)?;
        // SAFETY: `out` holds n u32 on this stream; `host` stays allocated and unwritten until
        // the event recorded after the copy completed (checked above on the next upload).
        unsafe { result::memcpy_htod_async(dst, &host[..n], self.stream.cu_stream()) }
            .map_err(|e| kernel_err("upload", e))?;
        let done = self
            .stream
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .and_then(|ev| ev.record(&self.stream).map(|()| ev));
        match done {
            Ok(ev) => *read = Some(ev),
            Err(e) => {
                // Without the event, wait for the copy here before the buffer is written again.
                let _ = self.stream.synchronize();
                return Err(kernel_err("event", e));
            }
        }
        Ok(out)
    }

    /// Row indices `0..n` (u32 `[n]`) on the device, uploaded once (through pinned memory)
    /// and kept: a gather of a step's first `n` rows needs no upload of its own, which from
    /// pageable memory could make the host wait for the step's forward.
    pub fn row_ids(&self, n: usize) -> Result<Tensor> {
        let mut ids = self.row_ids.lock();
        let have = ids.as_ref().map_or(0, |t| t.elem_count());
        if have < n {
            let len = n.next_power_of_two().max(1024);
            let all: Vec<u32> = (0..len as u32).collect();
            *ids = Some(self.upload_u32(&all)?);
        }
        match ids.as_ref() {
            Some(t) => Ok(t.narrow(0, 0, n)?),
            None => Err(kernel_err("row ids", "not uploaded")),
        }
    }
}
