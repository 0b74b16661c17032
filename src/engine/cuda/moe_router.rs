//! Launches of a sparse layer's router (`kernels/moe_route.cu`): the add+RMSNorm and the
//! router's matmul in one launch (`LaunchOptions::moe_norm_router`), and the router's matmul
//! with one token's routing in one launch (`LaunchOptions::moe_router_route`). Either is an
//! alternative to the dense kernels' norm and matmul in front of `moe_ops.rs`' experts; each
//! launcher returns false, launching nothing, where its kernel does not serve the step.

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use super::moe_ops::MoeScratch;
use crate::error::Result;

/// Most experts [`CudaKernels::moe_router_route_into`] serves: a cluster of at most 16 blocks
/// of eight router rows (the one-warp routing's bound is 128 too).
pub const MOE_ROUTER_ROUTE_MAX_EXPERTS: usize = 128;

impl CudaKernels {
    /// `h = rmsnorm(res + delta) * norm_w` (the sum written to `res_out` when `delta` is
    /// given) and `logits = h · routerᵀ` in one launch, for 1-2 rows of a hidden size of up
    /// to 4,096 and with `LaunchOptions::moe_norm_router`; false, with nothing launched,
    /// otherwise (the caller runs the norm and the matmul apart).
    pub fn moe_norm_router_into(
        &self,
        (res, delta, res_out): (&Tensor, Option<&Tensor>, &Tensor),
        (norm_w, eps): (&Tensor, f64),
        h: &Tensor,
        router: &Tensor,
        logits: &Tensor,
    ) -> Result<bool> {
        let Some(fs) = &self.moe.norm_router else {
            return Ok(false);
        };
        let (e, k) = router.dims2()?;
        let t = res.elem_count() / k.max(1);
        if !(1..=2).contains(&t) || k > 4096 || !k.is_multiple_of(8) {
            return Ok(false);
        }
        for x in [res, res_out, norm_w, h, router, logits] {
            self.check_dtype(x)?;
        }
        let fits = res.elem_count() == t * k
            && res_out.elem_count() == t * k
            && h.elem_count() == t * k
            && norm_w.elem_count() == k
            && logits.elem_count() == t * e
            && delta.is_none_or(|d| d.elem_count() == t * k);
        if !fits {
            return Err(kernel_err("moe_norm_router", "shapes do not fit"));
        }
        let (pw, pr, pro, pnw, ph, pl) = (
            self.ptr(router)?,
            self.ptr(res)?,
            self.ptr(res_out)?,
            self.ptr(norm_w)?,
            self.ptr(h)?,
            self.ptr(logits)?,
        );
        let (pd, add) = match delta {
            Some(d) => (self.ptr(d)?, 1i32),
            None => (pr, 0i32),
        };
        let (e32, k32, eps32) = (e as i32, k as i32, eps as f32);
        let cfg = LaunchConfig {
            grid_dim: (e.div_ceil(8) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: (t * k * 2) as u32,
        };
        let mut b = self.launcher(&fs[t - 1]);
        b.arg(&pw).arg(&pr).arg(&pd).arg(&pro).arg(&pnw).arg(&eps32);
        b.arg(&add).arg(&ph).arg(&pl).arg(&e32).arg(&k32);
        // SAFETY: argument types match `moe_norm_router_t*`; shapes checked above; t * k bf16
        // of dynamic shared memory (at most 16 KB).
        unsafe { b.launch(cfg) }.w()?;
        Ok(true)
    }

    /// `s.logits = h · routerᵀ` for one token `h` `[1, K]` and the token's routing (ids,
    /// weights, order and one-pair tiles, top-`s.top_k` renormalized when `norm`) in one
    /// launch: a cluster of ceil(E / 8) blocks gathers the logits in one block's shared memory,
    /// which routes as `moe_route_one` does (`LaunchOptions::moe_router_route`, bf16, sm_90,
    /// E <= 128). The same logits, ids, weights and tables as the matmul then the routing
    /// launch, so [`CudaKernels::moe_experts_into`] takes them with `routed` set. False, with
    /// nothing launched, where it does not serve (off, more than one token, more experts).
    pub fn moe_router_route_into(
        &self,
        h: &Tensor,
        router: &Tensor,
        s: &MoeScratch,
        norm: bool,
    ) -> Result<bool> {
        let Some(f) = &self.moe.router_route else {
            return Ok(false);
        };
        let (e, k) = router.dims2()?;
        let (t, top_k) = (h.elem_count() / k.max(1), s.top_k);
        let serves = t == 1
            && (1..=MOE_ROUTER_ROUTE_MAX_EXPERTS).contains(&e)
            && (1..=32).contains(&top_k)
            && top_k <= e
            && k.is_multiple_of(8)
            && self.dtype == DType::BF16;
        if !serves {
            return Ok(false);
        }
        for x in [h, router, &s.logits] {
            self.check_dtype(x)?;
        }
        let inter = s.act.dim(1)?;
        let (_, max_tiles) = self.moe_tiling(top_k, e, (k, inter), None)?;
        let fits = h.elem_count() == k
            && s.logits.dim(1)? == e
            && s.logits.dim(0)? >= 1
            && s.ids.elem_count() >= top_k
            && s.order.elem_count() >= top_k
            && s.tiles.elem_count() >= 3 * max_tiles;
        if !fits {
            return Err(kernel_err("moe_router_route", "shapes do not fit"));
        }
        let (pw, ph, pl) = (self.ptr(router)?, self.ptr(h)?, self.ptr(&s.logits)?);
        let (pids, pwt) = (self.ptr(&s.ids)?, self.ptr(&s.w)?);
        let (porder, ptiles) = (self.ptr(&s.order)?, self.ptr(&s.tiles)?);
        let (e32, k32, top32) = (e as i32, k as i32, top_k as i32);
        let (n32, mt32) = (i32::from(norm), max_tiles as i32);
        let blocks = e.div_ceil(8) as u32;
        let mut b = self.launcher(f);
        b.arg(&pw)
            .arg(&ph)
            .arg(&pl)
            .arg(&pids)
            .arg(&pwt)
            .arg(&porder);
        b.arg(&ptiles)
            .arg(&e32)
            .arg(&k32)
            .arg(&top32)
            .arg(&n32)
            .arg(&mt32);
        b.cluster_z(blocks);
        // SAFETY: argument types match `moe_router_route*_bf16`; router `[e, k]`, h `[1, k]`,
        // the scratch's logits, ids, weights, order and tiles sized above (e <= 128: at most
        // 16 blocks, one cluster, the non-portable size allowed at load).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (1, 1, blocks),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .w()?;
        Ok(true)
    }

    /// Whether the router's matmul and one token's routing run as one launch
    /// (`LaunchOptions::moe_router_route`; loaded on sm_90 in bf16 with `moe_route_one`).
    pub fn moe_router_route(&self) -> bool {
        self.moe.router_route.is_some()
    }

    /// A sparse layer's expert half from its normed input `h` `[T, hidden]`: the router's
    /// matmul (`router` `[E, hidden]`) and the routing — in one launch where
    /// [`Self::moe_router_route_into`] serves — then [`Self::moe_experts_into`], with buffers
    /// of its own, run `iters` times (at least once): the output, the router logits, whether
    /// the one launch served, and the mean wall time of the router and routing alone in µs
    /// (checks and benchmarks; the forward reuses its buffers).
    pub fn moe_router_experts(
        &self,
        h: &Tensor,
        router: &Tensor,
        experts: (&Tensor, &Tensor),
        (first, top_k, norm): (usize, usize, bool),
        iters: usize,
    ) -> Result<(Tensor, Tensor, bool, f64)> {
        let (t, hidden) = h.dims2()?;
        let (e, inter) = (router.dim(0)?, experts.1.dim(2)?);
        let s = self.moe_scratch(t, (e, top_k), inter, hidden)?;
        let out = self.alloc_out((t, hidden))?;
        let route = || -> Result<bool> {
            let fused = self.moe_router_route_into(h, router, &s, norm)?;
            if !fused {
                self.linear_into(h, router, &s.logits)?;
            }
            Ok(fused)
        };
        let fused = route()?;
        self.moe_experts_into(h, experts, (first, norm), &s, (&out, fused))?;
        candle_core::backend::BackendDevice::synchronize(&self.device)?;
        let start = std::time::Instant::now();
        for _ in 1..iters {
            route()?;
            if !fused {
                // The routing launch the one launch replaces, timed with it.
                self.moe_run(h, experts, (first, norm), &s, &out, (None, 0..1))?;
            }
        }
        candle_core::backend::BackendDevice::synchronize(&self.device)?;
        let us = start.elapsed().as_secs_f64() * 1e6 / iters.saturating_sub(1).max(1) as f64;
        Ok((out, s.logits.clone(), fused, us))
    }
}
