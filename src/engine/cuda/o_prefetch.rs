//! o's 1-row matmul prefetching into L2 the rows of the gate|up that that kernel loads after
//! its wait (`LaunchOptions::o_prefetch_mlp`; `kernels/gemv.cu` `gemv_pfm_t1_bf16`). While the
//! attention runs (latency-bound at one row: ~8 us for ~2.5 MB of K/V), o's blocks have their
//! own weights in flight and the memory is nearly idle; the gate|up's rows that its warps load
//! only after their wait (1.7B: the third batch, 2 x 7.9 MB) are then what a step waits for
//! last. The prefetch goes out after o's own loads (the option `l2_prefetch` issues it before
//! them, from every matmul, over the whole next weight: 15% slower at 1.7B batch 1). The same
//! sums as `gemv_t1_bf16` (the same bits).

use std::sync::Arc;

use candle_core::Tensor;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};

use super::kernels::{CudaKernels, LaunchOptions};
use super::launch::kernel_err;
use crate::error::Result;

/// The prefetching entry and the most bytes it prefetches (both halves together).
pub(crate) struct OPrefetch {
    f: CudaFunction,
    most: usize,
}

impl OPrefetch {
    /// The entry from the loaded `gemv` module when the options ask for it
    /// (`o_prefetch_mlp`, with the skinny matmuls on) and `serves` (sm_90, bf16).
    pub(super) fn load(
        m: &Arc<CudaModule>,
        opts: &LaunchOptions,
        serves: bool,
    ) -> Result<Option<Self>> {
        let Some(mib) = opts
            .o_prefetch_mlp
            .filter(|&n| n > 0 && opts.gemv && serves)
        else {
            return Ok(None);
        };
        let f = m
            .load_function("gemv_pfm_t1_bf16")
            .map_err(|e| kernel_err("function gemv_pfm_t1_bf16", e))?;
        Ok(Some(Self { f, most: mib << 20 }))
    }
}

impl CudaKernels {
    /// o's matmul `out = x · wᵀ` of a 1-row step (x `[1, k]`, w `[n, k]`) on the prefetching
    /// entry, which issues L2 prefetches of the rows of `gate_up` (`[2I, k']`, gate rows first)
    /// that the 1-row gate|up behind its norm loads after its wait: the last of them, at most
    /// `LaunchOptions::o_prefetch_mlp` MiB over both halves. False, with nothing launched, when
    /// the option is off or the step is not one it serves (more rows, a weight the plain 1-row
    /// kernel does not take, a gate|up whose rows all load before its wait).
    pub fn o_prefetch_mlp_into(
        &self,
        (x, w, out): (&Tensor, &Tensor, &Tensor),
        gate_up: &Tensor,
    ) -> Result<bool> {
        let Some(p) = self.o_prefetch.as_ref() else {
            return Ok(false);
        };
        let (n, k) = w.dims2()?;
        let (two_i, kg) = gate_up.dims2()?;
        let pairs = two_i / 2;
        if x.elem_count() != k || out.elem_count() != n || !self.plain_one_row_serves(n, k) {
            return Ok(false);
        }
        let Some(first) = self.gate_up_after_wait(pairs, kg) else {
            return Ok(false);
        };
        for t in [x, w, out, gate_up] {
            self.check_dtype(t)?;
        }
        let row = kg * 2;
        let start = first.max(pairs.saturating_sub(p.most / (2 * row)));
        if start >= pairs {
            return Ok(false);
        }
        let (pw, px, po, pg) = (
            self.ptr(w)?,
            self.ptr(x)?,
            self.ptr(out)?,
            self.ptr(gate_up)?,
        );
        let (gate, up) = (
            pg + (start * row) as u64,
            pg + ((pairs + start) * row) as u64,
        );
        let bytes = ((pairs - start) * row) as u64;
        let (n32, k32) = (n as i32, k as i32);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(super::gemm::GEMV_WARPS) as u32, 1, 1),
            block_dim: (32 * super::gemm::GEMV_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(&p.f);
        b.arg(&pw)
            .arg(&px)
            .arg(&po)
            .arg(&n32)
            .arg(&k32)
            .arg(&gate)
            .arg(&up)
            .arg(&bytes);
        // SAFETY: the arguments match `gemv_pfm_t1_bf16` in kernels/gemv.cu; the shapes are
        // checked above (w `[n, k]`, x `[1, k]`, out `[1, n]`, contiguous bf16, k a multiple of
        // 8 as the plain kernel needs); both prefetched ranges lie inside `gate_up` (rows
        // start..I of each half) and are multiples of 16 bytes.
        unsafe { b.launch(cfg) }.w()?;
        Ok(true)
    }
}
