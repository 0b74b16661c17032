//! The kernels of speculative verify steps (`kernels/verify.cu`): the shared-K/V verify
//! attention (`paged_verify_g*`: a sequence's last token and its drafts are consecutive decode
//! rows of a step, and one block serves up to 8 / G of them, G the GQA group, loading each K/V
//! row of its partition once for all their query heads instead of once a row;
//! `LaunchOptions::shared_kv_verify`), and the acceptance of drafts on the device
//! (`spec_accept`: the drawn tokens and each sequence's kept drafts in one buffer, one read).

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};

use super::attention::{decode_grid, reduce_grid};
use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::engine::kv_format::KvRef;
use crate::error::Result;

impl CudaKernels {
    /// Whether verify steps take the shared-K/V verify attention
    /// ([`CudaKernels::paged_verify_into`]; `LaunchOptions::shared_kv_verify`).
    pub fn shares_verify_kv(&self) -> bool {
        self.spec.shared.is_some()
    }

    /// Decode attention over rows of which runs of consecutive ones may be one sequence's
    /// positions (a verify step): `runs` (u32 `[B]`) holds `(j << 16) | n` for row `j` of a
    /// run of `n` rows (`1` for a lone decode row); the rest as
    /// [`CudaKernels::paged_decode_into`], which this is for GQA group 8 or without the
    /// verify kernels. Rows of a run must have consecutive context lengths and block tables
    /// that are prefixes of the run's last row's.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_verify_into(
        &self,
        q: &Tensor,
        kv: KvRef<'_>,
        tables: (&Tensor, Option<&Tensor>),
        ctx_lens: &Tensor,
        runs: &Tensor,
        block_size: usize,
        out: &Tensor,
        (splits, part, scratch): (usize, usize, Option<&(Tensor, Tensor)>),
    ) -> Result<()> {
        let (b, nh, _) = q.dims3()?;
        let nkv = kv.k.dim(0)?;
        let g = nh / nkv.max(1);
        // One kernel per GQA group 1, 2, 4 (group 8 takes one row a chunk: the decode kernel).
        let chunk = match g {
            1 => Some(0),
            2 => Some(1),
            4 => Some(2),
            _ => None,
        };
        let (Some(verify), Some(chunk)) = (self.spec.shared.as_ref(), chunk) else {
            let splits = (splits, part, scratch);
            return self.paged_decode_into(q, kv, tables, ctx_lens, block_size, out, splits);
        };
        if runs.dtype() != DType::U32 || runs.elem_count() != b {
            return Err(kernel_err(
                "paged_verify",
                format!("runs {:?} {:?} for {b} rows", runs.dtype(), runs.shape()),
            ));
        }
        let func = if kv.is_fp8() {
            let fs = verify.attend_fp8.as_ref();
            &fs.ok_or_else(|| kernel_err("paged_verify", "fp8 KV needs bf16 compute"))?[chunk]
        } else {
            &verify.attend[chunk]
        };
        let splits = splits.max(1);
        // Partitions as short as `splits` allows (16 tokens at least): a chunk's block serves
        // up to 8 query vectors, and its time is its rounds of dependent K/V loads, so short
        // partitions over more blocks finish sooner (the reduce cuts them alike).
        let part = 16.min(part);
        let what = "paged_verify";
        let sp = (splits, part, scratch);
        let params = self.decode_params(q, kv, tables, ctx_lens, block_size, out, sp, what)?;
        let runs_ptr = self.ptr(runs)?;
        let mut lb = self.launcher(func);
        lb.arg(&params).arg(&runs_ptr);
        // SAFETY: `DecodeParams` (same layout on both sides, checked at compile time) and the
        // runs pointer are the kernel's parameters; `runs` holds one u32 a row (checked above),
        // the other buffers are sized by `decode_params`.
        unsafe { lb.launch(decode_grid(b, nkv, splits)) }.w()?;
        if splits > 1 {
            let (part32, s32, rows) = (part as i32, splits as i32, (8 / g) as i32);
            let p = &params;
            let mut rb = self.launcher(&verify.reduce);
            rb.arg(&p.part_acc)
                .arg(&p.part_ml)
                .arg(&p.ctx_lens)
                .arg(&runs_ptr)
                .arg(&p.out)
                .arg(&s32)
                .arg(&part32)
                .arg(&rows);
            // SAFETY: as above; the reduce reads the partials the launch before wrote.
            unsafe { rb.launch(reduce_grid(b, nh)) }.w()?;
        }
        Ok(())
    }

    /// Drafts kept on the device: `ids` (u32 `[rows]`) the tokens drawn from a verify step's
    /// rows, `drafts` (u32 `[rows]`) the token each row's draw must equal for the next draft
    /// to stand (`u32::MAX` after a sequence's last draft), `starts` (u32 `[seqs + 1]`) where
    /// each sequence's rows begin. Returns u32 `[rows + seqs]`: the ids, then each sequence's
    /// count of kept drafts (the leading drafts equal to their row's draw), for one read.
    pub fn spec_accept(&self, ids: &Tensor, drafts: &Tensor, starts: &Tensor) -> Result<Tensor> {
        let rows = ids.elem_count();
        let seqs = starts.elem_count().saturating_sub(1);
        let u32s = [ids, drafts, starts]
            .iter()
            .all(|t| t.dtype() == DType::U32);
        if !u32s || drafts.elem_count() != rows || starts.elem_count() == 0 {
            return Err(kernel_err(
                "spec_accept",
                format!(
                    "ids {rows}, drafts {}, starts {}",
                    drafts.elem_count(),
                    starts.elem_count()
                ),
            ));
        }
        let out = self.alloc((rows + seqs,), DType::U32)?;
        let (pi, pd, ps, po) = (
            self.ptr(ids)?,
            self.ptr(drafts)?,
            self.ptr(starts)?,
            self.ptr(&out)?,
        );
        let (s32, r32) = (seqs as i32, rows as i32);
        let mut b = self.launcher(&self.spec.accept);
        b.arg(&pi).arg(&pd).arg(&ps).arg(&s32).arg(&r32).arg(&po);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types match the kernel's signature; `ids` and `drafts` hold `rows`
        // u32, `starts` `seqs + 1` (checked above; its values, row offsets up to `rows`, are
        // the caller's), `out` `rows + seqs`.
        unsafe { b.launch(cfg) }.w()?;
        Ok(out)
    }
}
