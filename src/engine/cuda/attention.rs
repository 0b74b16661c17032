//! Launches of the attention kernels (`kernels/attention.cu`): paged decode (flash-decoding
//! with a merge of partitions) and varlen causal prefill (tensor cores for bf16).

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};

use super::{CudaKernels, DECODE_PARTITION, PREFILL_TILE, kernel_err};
use crate::error::Result;

impl CudaKernels {
    /// Scratch for [`CudaKernels::paged_decode_into`]: partial results of `b` sequences in
    /// `splits` partitions (`None` when one partition covers them). One per forward, reused by
    /// every layer (launches on one stream do not overlap).
    pub fn decode_scratch(
        &self,
        b: usize,
        nh: usize,
        splits: usize,
    ) -> Result<Option<(Tensor, Tensor)>> {
        if splits <= 1 || b == 0 {
            return Ok(None);
        }
        Ok(Some((
            self.alloc((b, nh, splits, 128), DType::F32)?,
            self.alloc((b, nh, splits, 2), DType::F32)?,
        )))
    }

    /// Decode attention over the paged caches: q `[B, nh, 128]` (pre-scaled), block tables
    /// u32 `[B, W]`, context lengths u32 `[B]`. Returns `[B, nh * 128]`.
    pub fn paged_decode(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        block_tables: &Tensor,
        ctx_lens: &Tensor,
        block_size: usize,
    ) -> Result<Tensor> {
        let (b, nh, hd) = q.dims3()?;
        let out = self.alloc((b, nh * hd), self.dtype)?;
        let w = block_tables.dim(1)?;
        let part = Self::decode_partition(b);
        let splits = Self::decode_splits(w, block_size, part);
        let scratch = self.decode_scratch(b, nh, splits)?;
        self.paged_decode_into(
            q,
            k_cache,
            v_cache,
            (block_tables, None),
            ctx_lens,
            block_size,
            &out,
            (splits, part, scratch.as_ref()),
        )?;
        Ok(out)
    }

    /// Context tokens per flash-decoding partition for a batch of `b` decode sequences:
    /// short partitions in small batches, which alone would leave most SMs idle, up to
    /// 256 in large ones.
    pub fn decode_partition(b: usize) -> usize {
        match b {
            0..=4 => 32,
            5..=16 => 64,
            17..=64 => 128,
            _ => DECODE_PARTITION,
        }
    }

    /// Partitions of flash-decoding for block tables `w` blocks wide (one per `part` tokens
    /// of the widest table).
    pub fn decode_splits(w: usize, block_size: usize, part: usize) -> usize {
        (w * block_size).div_ceil(part.max(1)).max(1)
    }

    /// [`CudaKernels::paged_decode`] writing into `out` (a contiguous `[B, nh * 128]` view) in
    /// `splits` partitions of at least `part` tokens, with partials in `scratch` (from
    /// [`CudaKernels::decode_scratch`] for at least `B` sequences and `splits`). Each
    /// sequence's partitions cover its context (they grow past `part` tokens when `splits` is
    /// too few). With `width`
    /// (u32 `[1]` on the device) the tables' row width is read from there, not from
    /// `block_tables`' shape: a captured graph then serves tables of any width.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_decode_into(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        (block_tables, width): (&Tensor, Option<&Tensor>),
        ctx_lens: &Tensor,
        block_size: usize,
        out: &Tensor,
        (splits, part, scratch): (usize, usize, Option<&(Tensor, Tensor)>),
    ) -> Result<()> {
        self.check_dtype(q)?;
        let (b, nh, hd) = q.dims3()?;
        let (nkv, num_slots, _) = k_cache.dims3()?;
        let w = block_tables.elem_count() / b.max(1);
        if hd != 128 || nkv == 0 || nh % nkv != 0 {
            return Err(kernel_err(
                "paged_decode",
                format!("nh {nh} nkv {nkv} hd {hd}"),
            ));
        }
        let func = match nh / nkv {
            1 => &self.decode[0],
            2 => &self.decode[1],
            4 => &self.decode[2],
            8 => &self.decode[3],
            g => return Err(kernel_err("paged_decode", format!("GQA group {g}"))),
        };
        let splits = splits.max(1);
        let (acc, ml) = match scratch {
            _ if splits == 1 => (out.clone(), out.clone()),
            Some((a, m)) if a.elem_count() >= b * nh * splits * hd => (a.clone(), m.clone()),
            _ => return Err(kernel_err("paged_decode", "scratch missing or too small")),
        };
        let ptrs = [
            self.ptr(q)?,
            self.ptr(k_cache)?,
            self.ptr(v_cache)?,
            self.ptr(block_tables)?,
            self.ptr(ctx_lens)?,
            self.ptr(out)?,
            self.ptr(&acc)?,
            self.ptr(&ml)?,
        ];
        let pw = match width {
            Some(t) => self.ptr(t)?,
            None => 0,
        };
        let (w32, bs32, slots64, nkv32, part32) = (
            w as i32,
            block_size as i32,
            num_slots as i64,
            nkv as i32,
            part as i32,
        );
        let cfg = LaunchConfig {
            grid_dim: (b as u32, nkv as u32, splits as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut lb = self.launcher(func);
        for p in &ptrs {
            lb.arg(p);
        }
        lb.arg(&w32)
            .arg(&pw)
            .arg(&bs32)
            .arg(&slots64)
            .arg(&nkv32)
            .arg(&part32);
        // SAFETY: argument types match the kernel's signature; buffers are sized above.
        unsafe { lb.launch(cfg) }.w()?;
        if splits > 1 {
            let (pa, pm, pc, po, s32) = (ptrs[6], ptrs[7], ptrs[4], ptrs[5], splits as i32);
            let cfg = LaunchConfig {
                grid_dim: (b as u32, nh as u32, 1),
                block_dim: (hd as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut rb = self.launcher(&self.decode_reduce);
            rb.arg(&pa)
                .arg(&pm)
                .arg(&pc)
                .arg(&po)
                .arg(&s32)
                .arg(&part32);
            // SAFETY: as above.
            unsafe { rb.launch(cfg) }.w()?;
        }
        Ok(())
    }

    /// Whether a prefill kernel serves a GQA group of `g` query heads per KV head.
    pub fn prefill_supports(&self, g: usize) -> bool {
        match self.prefill_tc {
            Some(_) => matches!(g, 1 | 2 | 4 | 8),
            None => matches!(g, 1 | 2 | 4),
        }
    }

    /// Query tokens per prefill tile for a GQA group of `g` (the `tiles` the prefill kernel
    /// takes step by this): 64 query rows per block on tensor cores, 16 tokens otherwise.
    pub fn prefill_tile(&self, g: usize) -> usize {
        match self.prefill_tc {
            Some(_) => (64 / g.max(1)).max(1),
            None => PREFILL_TILE,
        }
    }

    /// Causal varlen attention of prefill chunks over the paged caches, written into the rows
    /// of `out` (`[T, nh * 128]`) that `seq_meta` names; on tensor cores for bf16. Tiles step
    /// by [`CudaKernels::prefill_tile`] query tokens. `tiles` u32 `[num_tiles * 2]` and
    /// `seq_meta` u32 `[S * 4]` are laid out as `kernels/attention.cu` says; `tables` holds
    /// the sequences' block tables back to back.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_prefill_into(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        tiles: &Tensor,
        seq_meta: &Tensor,
        tables: &Tensor,
        block_size: usize,
        out: &Tensor,
    ) -> Result<()> {
        self.check_dtype(q)?;
        let (_, nh, hd) = q.dims3()?;
        let (nkv, num_slots, _) = k_cache.dims3()?;
        let g = nh / nkv.max(1);
        let func = match (&self.prefill_tc, hd, nkv > 0 && nh % nkv == 0, g) {
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
        let ptrs = [
            self.ptr(q)?,
            self.ptr(k_cache)?,
            self.ptr(v_cache)?,
            self.ptr(tiles)?,
            self.ptr(seq_meta)?,
            self.ptr(tables)?,
            self.ptr(out)?,
        ];
        let (bs32, slots64, nkv32) = (block_size as i32, num_slots as i64, nkv as i32);
        let cfg = LaunchConfig {
            grid_dim: (num_tiles as u32, nkv as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.launcher(func);
        for p in &ptrs {
            b.arg(p);
        }
        b.arg(&bs32).arg(&slots64).arg(&nkv32);
        // SAFETY: argument types match the kernel's signature; the metadata was built for
        // these caches and `out`.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }
}
