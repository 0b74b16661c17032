//! Launches of the prefill attention kernels: the flash kernels (`kernels/flash_prefill.cu`
//! on mma.sync, `kernels/flash_prefill_sm90.cu` on warpgroup MMA, with split-KV and its merge),
//! the two-pass WMMA kernel and the CUDA-core kernel (`kernels/prefill.cu`).

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};

use super::kernels::{CudaKernels, FLASH_PREFILL_SMEM, FLASH_PREFILL_SMEM_SM90, PREFILL_TILE};
use super::launch::kernel_err;
use super::params::PrefillParams;
use crate::engine::kv_format::KvRef;
use crate::error::Result;

impl CudaKernels {
    /// Whether a prefill kernel serves a GQA group of `g` query heads per KV head.
    pub fn prefill_supports(&self, g: usize) -> bool {
        match self.prefill_tc {
            Some(_) => matches!(g, 1 | 2 | 4 | 8),
            None => matches!(g, 1 | 2 | 4),
        }
    }

    /// Query tokens per prefill tile for a GQA group of `g` (the `tiles` the prefill kernel
    /// takes step by this): 128 query rows per block on warpgroup MMA, 64 on the other tensor
    /// core kernels, 16 tokens on CUDA cores.
    pub fn prefill_tile(&self, g: usize) -> usize {
        let rows = if self.prefill_wgmma { 128 } else { 64 };
        match self.prefill_tc {
            Some(_) => (rows / g.max(1)).max(1),
            None => PREFILL_TILE,
        }
    }

    /// Causal varlen attention of prefill chunks over the paged caches, written into the rows
    /// of `out` (`[T, nh * 128]`) that `seq_meta` names; on tensor cores for bf16 (the flash
    /// kernels unless `LaunchOptions::flash_prefill` is off). Tiles step by
    /// [`CudaKernels::prefill_tile`] query tokens. `tiles` u32 `[num_tiles * 2]` and
    /// `seq_meta` u32 `[S * 4]` are laid out as `kernels/prefill.cu` says; `tables` holds
    /// the sequences' block tables back to back. `max_keys` is the longest context among
    /// the chunks: with it a launch of few blocks splits its keys (split-KV).
    #[allow(clippy::too_many_arguments)]
    pub fn paged_prefill_into(
        &self,
        q: &Tensor,
        kv: KvRef<'_>,
        tiles: &Tensor,
        seq_meta: &Tensor,
        tables: &Tensor,
        block_size: usize,
        max_keys: usize,
        out: &Tensor,
    ) -> Result<()> {
        self.check_dtype(q)?;
        let (k_cache, v_cache) = (kv.k, kv.v);
        let (rows, nh, hd) = q.dims3()?;
        let (nkv, num_slots, _) = k_cache.dims3()?;
        let g = nh / nkv.max(1);
        // An fp8 cache has the flash kernels only.
        let flash = if kv.is_fp8() {
            Some(&self.fp8_kernels("paged_prefill")?.prefill_flash).filter(|_| hd == 128)
        } else {
            self.prefill_flash.as_ref().filter(|_| hd == 128)
        };
        if kv.is_fp8() && flash.is_none() {
            return Err(kernel_err(
                "paged_prefill",
                format!("fp8 KV with head_dim {hd}"),
            ));
        }
        let func = match (
            flash.or(self.prefill_tc.as_ref()),
            hd,
            nkv > 0 && nh % nkv == 0,
            g,
        ) {
            (Some(tc), 128, true, 1) => &tc[0],
            (Some(tc), 128, true, 2) => &tc[1],
            (Some(tc), 128, true, 4) => &tc[2],
            (Some(tc), 128, true, 8) => &tc[3],
            (None, 128, true, 1) => &self.prefill[0],
            (None, 128, true, 2) => &self.prefill[1],
            (None, 128, true, 4) => &self.prefill[2],
            _ => {
                return Err(kernel_err(
                    "paged_prefill",
                    format!("nh {nh} nkv {nkv} hd {hd}"),
                ));
            }
        };
        let num_tiles = tiles.elem_count() / 2;
        if num_tiles == 0 {
            return Ok(());
        }
        // Split-KV when the blocks would not fill the GPU and the keys are many (a short
        // chunk over a long prefix): partial outputs in f32, merged by a second launch.
        let merge = self.prefill_merge.as_ref().filter(|_| flash.is_some());
        let splits = match merge {
            Some(_) => prefill_splits(num_tiles * nkv, max_keys, self.sms),
            None => 1,
        };
        let parts = if splits > 1 {
            let dev = q.device();
            Some((
                Tensor::zeros((splits, rows, nh, hd), DType::F32, dev)?,
                Tensor::zeros((splits, rows, nh, 2), DType::F32, dev)?,
            ))
        } else {
            None
        };
        let (part_o, part_ml) = match &parts {
            Some((o, ml)) => (self.ptr(o)?, self.ptr(ml)?),
            None => (0, 0),
        };
        let params = PrefillParams {
            q: self.ptr(q)?,
            k_cache: self.ptr(k_cache)?,
            v_cache: self.ptr(v_cache)?,
            tiles: self.ptr(tiles)?,
            seq_meta: self.ptr(seq_meta)?,
            tables: self.ptr(tables)?,
            out: self.ptr(out)?,
            num_slots: num_slots as i64,
            block_size: block_size as i32,
            nkv: nkv as i32,
            part_o,
            part_ml,
            splits: splits as i32,
            rows: rows as i32,
            k_scale: kv.scale.k,
            v_scale: kv.scale.v,
            k_new: match kv.fresh {
                Some((k, _)) if kv.is_fp8() => self.ptr(k)?,
                _ => 0,
            },
            v_new: match kv.fresh {
                Some((_, v)) if kv.is_fp8() => self.ptr(v)?,
                _ => 0,
            },
        };
        // The flash kernel takes one linear grid (split fastest, then KV head, tiles
        // longest-first).
        let cfg = if flash.is_some() {
            let (threads, smem) = if self.prefill_wgmma {
                (256, FLASH_PREFILL_SMEM_SM90)
            } else {
                (128, FLASH_PREFILL_SMEM)
            };
            LaunchConfig {
                grid_dim: ((num_tiles * nkv * splits) as u32, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: smem as u32,
            }
        } else {
            LaunchConfig {
                grid_dim: (num_tiles as u32, nkv as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            }
        };
        let mut b = self.launcher(func);
        b.arg(&params);
        // SAFETY: `PrefillParams` is the kernel's one parameter (same layout, checked at
        // compile time on both sides); the metadata was built for these caches and `out`,
        // the partials for `splits` x `rows`.
        unsafe { b.launch(cfg) }.w()?;
        if let (Some(m), true) = (merge, splits > 1) {
            let f = &m[g.trailing_zeros() as usize];
            let mut b = self.launcher(f);
            b.arg(&params);
            let cfg = LaunchConfig {
                grid_dim: ((num_tiles * nkv) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: as above; the partials were written by the launch before it.
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok(())
    }
}

/// Splits of the keys for a flash prefill launch of `blocks` blocks whose longest sequence
/// has `max_keys` keys, on a GPU of `sms` SMs (two blocks each): only when the blocks would
/// not give every SM one (measured on the H200: splitting 256 blocks of a 2k chunk three ways
/// cost 16-70%, splitting 64 blocks of a 512-token chunk over 32k nine ways gained 56%),
/// enough to fill the block slots once, each split at least 8 K/V tiles (512 keys), at most 16.
pub(crate) fn prefill_splits(blocks: usize, max_keys: usize, sms: usize) -> usize {
    let slots = 2 * sms.max(1);
    if blocks == 0 || blocks > sms.max(1) {
        return 1;
    }
    slots.div_ceil(blocks).min(max_keys / 512).clamp(1, 16)
}
