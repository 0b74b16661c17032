//! Launches of a sparse layer's norm and router (`kernels/moe_router.cu`), in front of
//! `moe_ops.rs`' experts: [`CudaKernels::moe_router_into`] picks among the dense kernels' norm
//! and matmul, the add+RMSNorm and the router's matmul in one launch
//! (`LaunchOptions::moe_norm_router`), the router's matmul with one token's routing in one
//! launch (`LaunchOptions::moe_router_route`) and the three in one
//! (`LaunchOptions::moe_norm_router_route`).

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use super::moe_ops::MoeScratch;
use crate::error::Result;

/// Most experts the one-launch routing serves (`LaunchOptions::moe_router_route`): a cluster of
/// at most 16 blocks of eight router rows (the one-warp routing's bound is 128 too).
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

    /// A sparse layer's add+RMSNorm (`res` = (residual, delta to add, where the sum goes),
    /// `norm` = (weight, eps), the normed row into `h`, which the experts read) and the router's
    /// matmul into `s.logits`, in as few launches as the options and the step allow; true when
    /// the token's routing was done with them (one token, `moe_router_route` or
    /// `moe_norm_router_route`), so [`CudaKernels::moe_experts_into`] takes `routed`. Every
    /// path gives the same `h`, sum and logits (and routing) bits, but `moe_norm_router`, whose
    /// norm rounds in its own order.
    pub fn moe_router_into(
        &self,
        res: (&Tensor, Option<&Tensor>, &Tensor),
        norm: (&Tensor, f64),
        h: &Tensor,
        router: &Tensor,
        s: &MoeScratch,
        norm_topk: bool,
    ) -> Result<bool> {
        if self.moe_norm_router_into(res, norm, h, router, &s.logits)? {
            return Ok(false);
        }
        if self.router_route_launch(Some((res, norm)), h, router, s, norm_topk)? {
            return Ok(true);
        }
        self.add_rmsnorm_to(res.1, res.0, res.2, norm.0, norm.1, h)?;
        if self.router_route_launch(None, h, router, s, norm_topk)? {
            return Ok(true);
        }
        self.linear_into(h, router, &s.logits)?;
        Ok(false)
    }

    /// The router's matmul `s.logits = h · routerᵀ` for one token (`h` `[1, K]`) and the
    /// token's routing (ids, weights, order and one-pair tiles, top-`s.top_k` renormalized when
    /// `norm_topk`) in one launch: a cluster of ceil(E / 8) blocks gathers the logits in block
    /// 0's shared memory, whose first warp routes as `moe_route_one` does (bf16, sm_90,
    /// E <= 128). With `norm_in`, `h` is first the add+RMSNorm of those inputs, computed by the
    /// same launch as `add_rmsnorm` computes it (`moe_norm_router_route`), else `h` is read.
    /// False, with nothing launched, where the option's kernel is not loaded or does not serve
    /// (more than one token, more experts, a sum written over its own input).
    #[allow(clippy::type_complexity)]
    fn router_route_launch(
        &self,
        norm_in: Option<((&Tensor, Option<&Tensor>, &Tensor), (&Tensor, f64))>,
        h: &Tensor,
        router: &Tensor,
        s: &MoeScratch,
        norm_topk: bool,
    ) -> Result<bool> {
        let m = &self.moe;
        let Some(f) = (match norm_in {
            Some(_) => m.norm_router_route.as_ref(),
            None => m.router_route.as_ref(),
        }) else {
            return Ok(false);
        };
        let (e, k) = router.dims2()?;
        let (t, top_k) = (h.elem_count() / k.max(1), s.top_k);
        let serves = t == 1
            && (1..=MOE_ROUTER_ROUTE_MAX_EXPERTS).contains(&e)
            && (1..=32).contains(&top_k)
            && top_k <= e
            && k.is_multiple_of(8)
            && k <= 4096
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
        let (n32, mt32) = (i32::from(norm_topk), max_tiles as i32);
        let blocks = e.div_ceil(8) as u32;
        let mut b = self.launcher(f);
        b.arg(&pw).arg(&ph).arg(&pl).arg(&pids).arg(&pwt);
        b.arg(&porder).arg(&ptiles).arg(&e32).arg(&k32).arg(&top32);
        b.arg(&n32).arg(&mt32);
        // The norm's inputs (`moe_norm_router_route*`), checked as `add_rmsnorm_to` checks them.
        let norm_args = match norm_in {
            Some(((res, delta, res_out), (norm_w, eps))) => {
                for x in [res, res_out, norm_w] {
                    self.check_dtype(x)?;
                }
                let ok = res.elem_count() == k
                    && res_out.elem_count() == k
                    && norm_w.elem_count() == k
                    && delta.is_none_or(|d| d.elem_count() == k && d.dtype() == res.dtype());
                if !ok {
                    return Err(kernel_err("moe_norm_router_route", "shapes do not fit"));
                }
                let (pr, pro) = (self.ptr(res)?, self.ptr(res_out)?);
                if delta.is_some() && pr == pro {
                    // Other blocks read the residual block 0 writes the sum over.
                    return Ok(false);
                }
                let pd = delta.map(|d| self.ptr(d)).transpose()?.unwrap_or(pr);
                let add = i32::from(delta.is_some());
                Some((pr, pd, pro, self.ptr(norm_w)?, eps as f32, add))
            }
            None => None,
        };
        if let Some((pr, pd, pro, pnw, eps32, add)) = &norm_args {
            b.arg(pr).arg(pd).arg(pro).arg(pnw).arg(eps32).arg(add);
        }
        b.cluster_z(blocks);
        // SAFETY: argument types match `moe_router_route*_bf16` (and, with the norm's six,
        // `moe_norm_router_route*_bf16`); router `[e, k]`, h `[1, k]`, the residual, its sum
        // and the norm weight `[k]`, the scratch's logits, ids, weights, order and tiles sized
        // above (e <= 128: at most 16 blocks, one cluster, the non-portable size allowed at
        // load); with the norm, k bf16 of dynamic shared memory (at most 8 KB).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (1, 1, blocks),
                block_dim: (256, 1, 1),
                shared_mem_bytes: if norm_args.is_some() {
                    (k * 2) as u32
                } else {
                    0
                },
            })
        }
        .w()?;
        Ok(true)
    }

    /// Whether one token's router matmul and routing run as one launch
    /// (`LaunchOptions::moe_router_route`; loaded on sm_90 in bf16 with `moe_route_one`).
    pub fn moe_router_route(&self) -> bool {
        self.moe.router_route.is_some()
    }

    /// Whether the add+RMSNorm runs in that launch too (`LaunchOptions::moe_norm_router_route`).
    pub fn moe_norm_router_route(&self) -> bool {
        self.moe.norm_router_route.is_some()
    }

    /// A sparse layer's expert half of one step from the residual `res` `[T, hidden]` and
    /// the delta to add to it: [`Self::moe_router_into`] (the sum into a new buffer, `h`, the
    /// logits) then [`Self::moe_experts_into`], with buffers of its own, run `iters` times
    /// (at least once): the output, `h`, the sum, the logits, whether the routing ran with the
    /// router, and the mean wall time of the norm, router and routing alone in µs (checks and
    /// benchmarks; the forward reuses its buffers).
    #[allow(clippy::type_complexity)]
    pub fn moe_norm_experts(
        &self,
        (res, delta): (&Tensor, Option<&Tensor>),
        norm: (&Tensor, f64),
        router: &Tensor,
        experts: (&Tensor, &Tensor),
        (first, top_k, norm_topk): (usize, usize, bool),
        iters: usize,
    ) -> Result<(Tensor, Tensor, Tensor, Tensor, bool, f64)> {
        let (t, hidden) = res.dims2()?;
        let (e, inter) = (router.dim(0)?, experts.1.dim(2)?);
        let s = self.moe_scratch(t, (e, top_k), inter, hidden)?;
        let (out, h, sum) = (
            self.alloc_out((t, hidden))?,
            self.alloc_out((t, hidden))?,
            self.alloc_out((t, hidden))?,
        );
        let route = || self.moe_router_into((res, delta, &sum), norm, &h, router, &s, norm_topk);
        let routed = route()?;
        self.moe_experts_into(&h, experts, (first, norm_topk), &s, (&out, routed))?;
        candle_core::backend::BackendDevice::synchronize(&self.device)?;
        let start = std::time::Instant::now();
        for _ in 1..iters {
            route()?;
            if !routed {
                // The routing launch the one launch folds in, timed with it.
                self.moe_run(&h, experts, (first, norm_topk), &s, &out, (None, 0..1))?;
            }
        }
        candle_core::backend::BackendDevice::synchronize(&self.device)?;
        let us = start.elapsed().as_secs_f64() * 1e6 / iters.saturating_sub(1).max(1) as f64;
        Ok((out, h, sum, s.logits.clone(), routed, us))
    }
}
