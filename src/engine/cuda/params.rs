//! The parameters of the attention kernels, one `#[repr(C)]` struct per family, mirroring the
//! structs of the same names in `kernels/attention.cuh` (each kernel takes its struct by
//! value instead of 10-22 positional arguments). Sizes and field offsets are asserted at
//! compile time here and in the header.

use super::kernels::CudaKernels;
use crate::engine::kv_format::KvScale;
use crate::error::Result;
use candle_core::Tensor;

/// The fields the decode kernels' parameters share after their buffers: the block tables'
/// row width (and where the device holds it, 0 for none), cache slots, block size, KV heads
/// and the least partition length (the tail of `DecodeParams` in `kernels/attention.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct DecodeGeometry {
    width: u64,
    num_slots: i64,
    w: i32,
    block_size: i32,
    nkv: i32,
    part: i32,
    /// The layer's K and V scales (fp8 caches; 1 otherwise).
    k_scale: f32,
    v_scale: f32,
}

impl DecodeGeometry {
    pub(super) fn new(
        k: &CudaKernels,
        (w, width): (usize, Option<&Tensor>),
        block_size: usize,
        num_slots: usize,
        nkv: usize,
        part: usize,
        scale: KvScale,
    ) -> Result<Self> {
        Ok(Self {
            w: w as i32,
            width: match width {
                Some(t) => k.ptr(t)?,
                None => 0,
            },
            block_size: block_size as i32,
            num_slots: num_slots as i64,
            nkv: nkv as i32,
            part: part as i32,
            k_scale: scale.k,
            v_scale: scale.v,
        })
    }
}

/// `DecodeParams` of `kernels/attention.cuh`: the one parameter of `paged_decode_g*`
/// (device pointers as `u64`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct DecodeParams {
    pub(super) q: u64,
    pub(super) k_cache: u64,
    pub(super) v_cache: u64,
    pub(super) block_tables: u64,
    pub(super) ctx_lens: u64,
    pub(super) out: u64,
    pub(super) part_acc: u64,
    pub(super) part_ml: u64,
    pub(super) geometry: DecodeGeometry,
}

/// `FusedDecodeParams` of `kernels/attention.cuh`: the one parameter of `decode_fused_g*`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct FusedDecodeParams {
    pub(super) qkv: u64,
    pub(super) q_w: u64,
    pub(super) k_w: u64,
    pub(super) inv_freq: u64,
    pub(super) pos: u64,
    pub(super) slots: u64,
    pub(super) k_cache: u64,
    pub(super) v_cache: u64,
    pub(super) block_tables: u64,
    pub(super) ctx_lens: u64,
    pub(super) out: u64,
    pub(super) part_acc: u64,
    pub(super) part_ml: u64,
    pub(super) counters: u64,
    pub(super) geometry: DecodeGeometry,
    pub(super) eps: f32,
    pub(super) stop: i32,
    /// log2 of the grid's KV heads per cache KV head (`kernels/fused_decode.cu`).
    pub(super) kv_shift: i32,
    /// Unused: the C side's last field, so both structs end alike (size asserted below).
    pub(super) pad: i32,
}

/// `PrefillParams` of `kernels/attention.cuh`: the one parameter of `paged_prefill_*`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct PrefillParams {
    pub(super) q: u64,
    pub(super) k_cache: u64,
    pub(super) v_cache: u64,
    pub(super) tiles: u64,
    pub(super) seq_meta: u64,
    pub(super) tables: u64,
    pub(super) out: u64,
    pub(super) num_slots: i64,
    pub(super) block_size: i32,
    pub(super) nkv: i32,
    pub(super) part_o: u64,
    pub(super) part_ml: u64,
    pub(super) splits: i32,
    pub(super) rows: i32,
    pub(super) k_scale: f32,
    pub(super) v_scale: f32,
    /// fp8 caches: the chunks' own K and V unrounded (bf16 `[rows, nkv, 128]`), or 0.
    pub(super) k_new: u64,
    pub(super) v_new: u64,
}

// The sizes `kernels/attention.cuh` asserts for the same structs (a field added on one side
// only fails the build).
const _: () = assert!(std::mem::size_of::<DecodeParams>() == 104);
const _: () = assert!(std::mem::size_of::<FusedDecodeParams>() == 168);
const _: () = assert!(std::mem::size_of::<PrefillParams>() == 120);
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(DecodeParams, geometry) == 64);
    assert!(offset_of!(FusedDecodeParams, geometry) == 112);
    assert!(offset_of!(FusedDecodeParams, eps) == 152);
    assert!(offset_of!(PrefillParams, num_slots) == 56);
    assert!(offset_of!(PrefillParams, nkv) == 68);
    assert!(offset_of!(PrefillParams, splits) == 88);
    assert!(offset_of!(DecodeGeometry, num_slots) == 8);
    assert!(offset_of!(DecodeGeometry, part) == 28);
};
