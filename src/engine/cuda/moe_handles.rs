//! The MoE kernels' handles ([`MoeKernels`]), loaded with the rest (`CudaKernels::new`) and
//! launched from `moe_ops.rs`.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule};

use super::launch_options::LaunchOptions;
use crate::error::Result;

/// The MoE kernels (`kernels/moe_route.cu`, `kernels/moe_router.cu`, `kernels/moe.cu`,
/// `kernels/moe_mma.cu`): routing and sums `[bf16, f32]`; the experts' matmuls on CUDA cores
/// `[bf16 tile 8, f32 tile 8, f32 tile 32, bf16 tile 1]` and on tensor cores (bf16)
/// `[tile 16, tile 64]` (see `super::moe_ops::moe_tile`).
pub(super) struct MoeKernels {
    pub(super) _modules: [Arc<CudaModule>; 4],
    pub(super) route: [CudaFunction; 2],
    pub(super) align: CudaFunction,
    pub(super) route_align: [CudaFunction; 2],
    pub(super) simt_gate_up: [CudaFunction; 4],
    pub(super) simt_down: [CudaFunction; 4],
    pub(super) mma_gate_up: [CudaFunction; 2],
    pub(super) mma_down: [CudaFunction; 2],
    pub(super) sum: [CudaFunction; 2],
    /// Steps of up to 64 pairs take one-pair tiles (bf16; `LaunchOptions::moe_tile_one`).
    pub(super) tile_one: bool,
    /// The add+RMSNorm and the router's matmul in one launch for 1 and 2 rows (bf16 with
    /// `LaunchOptions::moe_norm_router`).
    pub(super) norm_router: Option<[CudaFunction; 2]>,
    /// Down and the experts' sum in one launch on one-pair tiles (bf16 with
    /// `LaunchOptions::moe_down_sum`; the tokens' expert order ranked by one warp with
    /// `LaunchOptions::moe_rank_sort`).
    pub(super) down_sum: Option<CudaFunction>,
    /// One token's routing and alignment by one warp, `[bf16, f32]`
    /// (`LaunchOptions::moe_route_one`; its picks by warp reductions with `moe_route_redux`).
    pub(super) route_one: Option<[CudaFunction; 2]>,
    /// The one-pair gate|up loading its weights evict-first (`LaunchOptions::moe_gate_up_cs`).
    pub(super) gate_up_cs: Option<CudaFunction>,
}

impl MoeKernels {
    /// The functions of the four modules (routing, the router's matmul in one launch with the
    /// norm, experts on CUDA cores, experts on tensor cores) by name (`f` loads one), the
    /// variants `opts` asks for (those of bf16 only when `bf16`).
    pub(super) fn load(
        [route, router, moe, mma]: [&Arc<CudaModule>; 4],
        (opts, bf16): (&LaunchOptions, bool),
        f: impl Fn(&Arc<CudaModule>, &str) -> Result<CudaFunction>,
    ) -> Result<Self> {
        let both = |m: &Arc<CudaModule>, name: &str| -> Result<[CudaFunction; 2]> {
            Ok([
                f(m, &format!("{name}_bf16"))?,
                f(m, &format!("{name}_f32"))?,
            ])
        };
        // CUDA cores: [bf16 tile 8, f32 tile 8, f32 tile 32, bf16 tile 1].
        let simt = |kind: &str| -> Result<[CudaFunction; 4]> {
            Ok([
                f(moe, &format!("moe_{kind}_t8_bf16"))?,
                f(moe, &format!("moe_{kind}_t8_f32"))?,
                f(moe, &format!("moe_{kind}_t32_f32"))?,
                f(moe, &format!("moe_{kind}_t1_bf16"))?,
            ])
        };
        let tensor = |kind: &str| -> Result<[CudaFunction; 2]> {
            Ok([
                f(mma, &format!("moe_{kind}_m16_bf16"))?,
                f(mma, &format!("moe_{kind}_m64_bf16"))?,
            ])
        };
        Ok(Self {
            route: both(route, "moe_route")?,
            align: f(route, "moe_align")?,
            route_align: both(route, "moe_route_align")?,
            simt_gate_up: simt("gate_up")?,
            simt_down: simt("down")?,
            mma_gate_up: tensor("gate_up")?,
            mma_down: tensor("down")?,
            sum: both(moe, "moe_sum")?,
            tile_one: opts.moe_tile_one,
            norm_router: if opts.moe_norm_router && bf16 {
                Some([
                    f(router, "moe_norm_router_t1")?,
                    f(router, "moe_norm_router_t2")?,
                ])
            } else {
                None
            },
            down_sum: (opts.moe_down_sum && bf16)
                .then(|| {
                    let rk = if opts.moe_rank_sort { "_rk" } else { "" };
                    f(moe, &format!("moe_down_sum{rk}_bf16"))
                })
                .transpose()?,
            route_one: opts
                .moe_route_one
                .then(|| {
                    let rx = if opts.moe_route_redux { "_rx" } else { "" };
                    both(route, &format!("moe_route_one{rx}"))
                })
                .transpose()?,
            gate_up_cs: (bf16 && opts.moe_gate_up_cs)
                .then(|| f(moe, "moe_gate_up_t1_cs_bf16"))
                .transpose()?,
            _modules: [route.clone(), router.clone(), moe.clone(), mma.clone()],
        })
    }
}
