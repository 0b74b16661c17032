//! The qkv matmul's LoRA delta added inside the fused decode attention
//! (`LaunchOptions::lora_attn_expand`, `kernels/fused_decode.cu` `decode_fused_lora_*`): what
//! the forward hands [`CudaKernels::decode_fused_into`] instead of launching the expand.

use candle_core::{DType, Tensor};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use super::params::FusedLoraParams;
use crate::error::Result;

/// The largest adapter rank [`CudaKernels::decode_fused_into`] adds a delta of (the kernel's
/// rows of `b` in registers).
pub const FUSED_LORA_MAX_RANK: usize = 16;

/// The qkv matmul's LoRA delta for [`CudaKernels::decode_fused_into`] to add: the shrink's `y`
/// (f32 `[B, 3 r]` at its start), the adapters' `b` of the fused qkv (`[slots, (nh + 2 nkv) *
/// 128, r]`) and the step's one-token tile table (u32 `[tiles, 3]`: token, count, slot).
#[derive(Clone, Copy)]
pub struct FusedLora<'a> {
    /// The shrink's output.
    pub y: &'a Tensor,
    /// The adapters' `b`.
    pub b: &'a Tensor,
    /// The tile table.
    pub tiles: &'a Tensor,
}

impl CudaKernels {
    /// Whether [`CudaKernels::decode_fused_into`] adds a LoRA delta of rank `r` over caches of
    /// `fp8` or the compute dtype (`LaunchOptions::lora_attn_expand`, bf16 caches, `r` up to
    /// 16).
    pub fn fused_lora_serves(&self, r: usize, fp8: bool) -> bool {
        self.decode_fused_lora.is_some() && !fp8 && r <= FUSED_LORA_MAX_RANK
    }

    /// The kernel's LoRA parameters for `l` on a step of `rows` rows of `nrow` qkv outputs,
    /// checked.
    pub(super) fn fused_lora_params(
        &self,
        l: FusedLora<'_>,
        fp8: bool,
        rows: usize,
        nrow: usize,
    ) -> Result<FusedLoraParams> {
        let (slots, nout, r) = l.b.dims3()?;
        let ntiles = l.tiles.elem_count() / 3;
        let fits = self.fused_lora_serves(r, fp8)
            && nout == nrow
            && r.is_multiple_of(8)
            && l.y.dtype() == DType::F32
            && l.y.elem_count() >= rows * 3 * r
            && l.tiles.dtype() == DType::U32
            && l.tiles.elem_count() == 3 * ntiles;
        if !fits {
            return Err(kernel_err(
                "decode_fused lora",
                format!("rank {r}, b {:?}, rows {rows}", l.b.dims()),
            ));
        }
        self.check_dtype(l.b)?;
        Ok(FusedLoraParams {
            y: self.ptr(l.y)?,
            b: self.ptr(l.b)?,
            tiles: self.ptr(l.tiles)?,
            ntiles: ntiles as i32,
            r: r as i32,
            slots: slots as i32,
            pad: 0,
        })
    }
}
