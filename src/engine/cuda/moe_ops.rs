//! Launches of the MoE kernels (`kernels/moe_route.cu`, `kernels/moe.cu`, the tensor-core tiles in `kernels/moe_mma.cu`): one sparse layer's experts on the device,
//! from the normed hidden state to the layer's (partial) output, with the router's matmul
//! on the dense kernels. No host synchronization, launch shapes fixed by the token count:
//! decode steps of MoE models are captured in CUDA graphs as dense ones are.

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};

use super::kernels::CudaKernels;
use super::launch::kernel_err;
use crate::error::Result;

/// Pairs (token, expert) of one expert a tile of the expert kernels takes: 8 (CUDA cores,
/// either dtype), 16 (bf16 on tensor cores, 16 pairs x 64 outputs a block), 32 (f32's wide
/// tile, CUDA cores), 64 (bf16's wide tile, tensor cores, 64 pairs x 64 outputs a block) and
/// 1 (bf16, CUDA cores, a third of tile 8's registers: more warps in flight for steps of up
/// to 64 pairs, with `LaunchOptions::moe_tile_one`).
pub const MOE_TILES: [usize; 5] = [8, 16, 32, 64, 1];

/// Most pairs of a step on one-pair tiles (with `LaunchOptions::moe_tile_one`).
pub const MOE_TILE_ONE_MAX: usize = 64;

/// The tile for `pairs` pairs over `experts` experts. bf16 with sizes the tensor-core tiles
/// take (`wide_ok`: multiples of 64): 8 for steps of up to 16 pairs (one or two tokens), 16
/// until an expert averages 32 pairs, then 64 — on the H200 (`kernel_check`'s `moe timing`,
/// the 30B-A3B shape) one token takes 72 µs on tile 8 against 93 on 16, 8 tokens 226 µs on 16
/// against 273 on 8, 64 tokens 409 against 932, 256 tokens 497 against 734 on 64, 2,048
/// tokens 1,432 on 64 against 2,199 on 16. f32 (checks): 8, and 32 from 16 pairs an expert.
/// `one`: bf16 steps of up to [`MOE_TILE_ONE_MAX`] pairs take tile 1 (one token 42 µs against
/// 54 on tile 8, eight tokens 162 against 197 on 16; 64 tokens 883 against 371: not there).
pub fn moe_tile(pairs: usize, experts: usize, bf16: bool, wide_ok: bool, one: bool) -> usize {
    let e = experts.max(1);
    if bf16 && one && pairs <= MOE_TILE_ONE_MAX {
        MOE_TILES[4]
    } else if bf16 && wide_ok {
        if pairs <= 16 {
            MOE_TILES[0]
        } else if pairs < 32 * e {
            MOE_TILES[1]
        } else {
            MOE_TILES[3]
        }
    } else if !bf16 && pairs >= 16 * e {
        MOE_TILES[2]
    } else {
        MOE_TILES[0]
    }
}

/// Tiles a step of `pairs` pairs over `experts` experts may need with tiles of `tm`: each
/// expert's last tile may be partial.
pub fn moe_max_tiles(pairs: usize, experts: usize, tm: usize) -> usize {
    pairs.div_ceil(tm) + experts.min(pairs)
}

/// The buffers of one sparse layer's launches for up to `t` tokens (shared by every layer).
pub struct MoeScratch {
    /// Router logits `[T, E]` (compute dtype).
    pub(crate) logits: Tensor,
    /// Chosen experts `[T * k]` (u32).
    ids: Tensor,
    /// Their weights `[T * k]` (f32).
    w: Tensor,
    /// Pair indices grouped by expert `[T * k]` (u32).
    order: Tensor,
    /// Tiles (start, count, expert) (u32, room for the one-pair tile's worst case).
    tiles: Tensor,
    /// SiLU(gate) * up per pair `[T * k, I]`.
    act: Tensor,
    /// Each pair's weighted expert output `[T * k, hidden]`.
    y: Tensor,
    top_k: usize,
}

impl MoeScratch {
    /// The first `t` tokens' share (a graph bucket's of the largest bucket's buffers).
    pub(crate) fn rows(&self, t: usize) -> Result<Self> {
        let p = t * self.top_k;
        let e = self.logits.dim(1)?;
        let n = |x: &Tensor, r: usize| -> Result<Tensor> { Ok(x.narrow(0, 0, r)?) };
        Ok(Self {
            logits: n(&self.logits, t)?,
            ids: n(&self.ids, p)?,
            w: n(&self.w, p)?,
            order: n(&self.order, p)?,
            tiles: n(&self.tiles, 3 * moe_max_tiles(p, e, 1))?,
            act: n(&self.act, p)?,
            y: n(&self.y, p)?,
            top_k: self.top_k,
        })
    }

    /// Bytes these buffers hold.
    pub(crate) fn bytes(&self) -> usize {
        [
            &self.logits,
            &self.ids,
            &self.w,
            &self.order,
            &self.tiles,
            &self.act,
            &self.y,
        ]
        .iter()
        .map(|x| x.elem_count() * x.dtype().size_in_bytes())
        .sum()
    }
}

impl CudaKernels {
    /// Buffers for sparse layers of `experts` experts, top-`top_k`, expert MLP size `inter`
    /// (this rank's) and `hidden`, for up to `t` tokens.
    pub(crate) fn moe_scratch(
        &self,
        t: usize,
        (experts, top_k): (usize, usize),
        inter: usize,
        hidden: usize,
    ) -> Result<MoeScratch> {
        let p = t.max(1) * top_k;
        Ok(MoeScratch {
            logits: self.alloc_out((t.max(1), experts))?,
            ids: self.alloc(p, DType::U32)?,
            w: self.alloc(p, DType::F32)?,
            order: self.alloc(p, DType::U32)?,
            tiles: self.alloc(3 * moe_max_tiles(p, experts, 1), DType::U32)?,
            act: self.alloc_out((p, inter))?,
            y: self.alloc_out((p, hidden))?,
            top_k,
        })
    }

    /// [`Self::moe_experts_into`] from router logits `logits` `[T, E]` into a new output,
    /// with buffers of its own, on tiles of `tile` pairs when given (one of [`MOE_TILES`]
    /// the dtype has), run `iters` times (at least once): the output and the mean wall time
    /// of one run in µs, then of each of its launches alone — routing (+ alignment), gate|up,
    /// down, sum — each run `iters` times back to back (checks and benchmarks; the forward
    /// reuses its buffers).
    pub fn moe_experts(
        &self,
        h: &Tensor,
        logits: &Tensor,
        experts: (&Tensor, &Tensor),
        (first, top_k, norm): (usize, usize, bool),
        (tile, iters): (Option<usize>, usize),
    ) -> Result<(Tensor, f64, [f64; 4])> {
        let (t, hidden) = h.dims2()?;
        let (e, inter) = (logits.dim(1)?, experts.1.dim(2)?);
        let s = self.moe_scratch(t, (e, top_k), inter, hidden)?;
        s.logits.slice_set(&logits.contiguous()?, 0, 0)?;
        let out = self.alloc_out((t, hidden))?;
        let run = |stages: std::ops::Range<usize>| {
            self.moe_run(h, experts, (first, norm), &s, &out, (tile, stages))
        };
        run(0..4)?;
        let time = |stages: std::ops::Range<usize>| -> Result<f64> {
            candle_core::backend::BackendDevice::synchronize(&self.device)?;
            let start = std::time::Instant::now();
            for _ in 1..iters {
                run(stages.clone())?;
            }
            candle_core::backend::BackendDevice::synchronize(&self.device)?;
            Ok(start.elapsed().as_secs_f64() * 1e6 / iters.saturating_sub(1).max(1) as f64)
        };
        let us = time(0..4)?;
        let mut each = [0.0; 4];
        if iters > 1 {
            for (i, x) in each.iter_mut().enumerate() {
                *x = time(i..i + 1)?;
            }
        }
        Ok((out, us, each))
    }

    /// Whether MoE steps on one-pair tiles run down and the experts' sum in one launch
    /// (`LaunchOptions::moe_down_sum`, bf16).
    pub fn moe_down_sum(&self) -> bool {
        self.moe.down_sum.is_some()
    }

    /// Whether one-pair tiles load the experts' gate|up evict-first
    /// (`LaunchOptions::moe_gate_up_cs`; bf16).
    pub fn moe_gate_up_cs(&self) -> bool {
        self.moe.gate_up_cs.is_some()
    }

    /// One sparse layer's experts: `h` `[T, hidden]` (normed) with the router's logits
    /// already in `s.logits` (`[T, E]`) -> `out` `[T, hidden]`, this rank's experts
    /// `first..first + local` (the stacked `gate_up` `[local, 2I, hidden]` and `down`
    /// `[local, hidden, I]`), top-`k` with the weights renormalized when `norm`.
    pub fn moe_experts_into(
        &self,
        h: &Tensor,
        experts: (&Tensor, &Tensor),
        how: (usize, bool),
        s: &MoeScratch,
        out: &Tensor,
    ) -> Result<()> {
        self.moe_run(h, experts, how, s, out, (None, 0..4))
    }

    /// [`Self::moe_experts_into`] on tiles of `tile` pairs when given, launching only the
    /// launches of `stages` (0 routing and alignment, 1 gate|up, 2 down, 3 sum; timing runs
    /// one at a time, over buffers a full run filled).
    fn moe_run(
        &self,
        h: &Tensor,
        (gate_up, down): (&Tensor, &Tensor),
        (first, norm): (usize, bool),
        s: &MoeScratch,
        out: &Tensor,
        (tile, stages): (Option<usize>, std::ops::Range<usize>),
    ) -> Result<()> {
        for x in [h, gate_up, down, out, &s.logits, &s.act, &s.y] {
            self.check_dtype(x)?;
        }
        let (t, hidden) = h.dims2()?;
        let (local, two_i, _) = gate_up.dims3()?;
        let inter = two_i / 2;
        let (e, k) = (s.logits.dim(1)?, s.top_k);
        let p = t * k;
        let bf16 = self.dtype == DType::BF16;
        let wide_ok = inter.is_multiple_of(64) && hidden.is_multiple_of(64);
        let tm = match tile {
            None => moe_tile(p, e, bf16, wide_ok, self.moe.tile_one),
            Some(8) => 8,
            Some(1) if bf16 => 1,
            Some(32) if !bf16 => 32,
            Some(t @ (16 | 64)) if bf16 && wide_ok => t,
            Some(other) => {
                return Err(kernel_err(
                    "moe_experts",
                    format!("no {other}-pair tile for this dtype and these sizes"),
                ));
            }
        };
        let max_tiles = moe_max_tiles(p, e, tm);
        let fits = s.logits.dim(0)? == t
            && gate_up.dims3()? == (local, 2 * inter, hidden)
            && down.dims3()? == (local, hidden, inter)
            && out.elem_count() == t * hidden
            && s.ids.elem_count() == p
            && s.act.elem_count() == p * inter
            && s.y.elem_count() == p * hidden
            && s.tiles.elem_count() >= 3 * max_tiles
            && (1..=32).contains(&k)
            && k <= e
            && e <= 1024
            && first + local <= e
            && hidden.is_multiple_of(8)
            && inter.is_multiple_of(8);
        if !fits {
            return Err(kernel_err(
                "moe_experts",
                format!(
                    "shapes do not fit: T {t}, hidden {hidden}, experts {e} (local {local} from {first}), top-{k}, inter {inter}"
                ),
            ));
        }
        let m = &self.moe;
        let bf = usize::from(self.dtype == DType::F32);
        // CUDA cores: [bf16 tile 8, f32 tile 8, f32 tile 32, bf16 tile 1]; tensor cores:
        // [16, 64].
        let (mma, fi) = match tm {
            16 => (true, 0),
            64 => (true, 1),
            32 => (false, 2),
            1 => (false, 3),
            _ => (false, bf),
        };
        let (pl, pids, pw) = (self.ptr(&s.logits)?, self.ptr(&s.ids)?, self.ptr(&s.w)?);
        let (porder, ptiles) = (self.ptr(&s.order)?, self.ptr(&s.tiles)?);
        let (ph, pgu, pdn) = (self.ptr(h)?, self.ptr(gate_up)?, self.ptr(down)?);
        let (pact, py, pout) = (self.ptr(&s.act)?, self.ptr(&s.y)?, self.ptr(out)?);
        let (t32, e32, k32, n32) = (t as i32, e as i32, k as i32, i32::from(norm));
        let (p32, tm32, mt32) = (p as i32, tm as i32, max_tiles as i32);
        let (h32, i32_, f32_, l32) = (hidden as i32, inter as i32, first as i32, local as i32);
        let grid = |x: usize, y: usize, threads: u32, smem: u32| LaunchConfig {
            grid_dim: (x.max(1) as u32, y.max(1) as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        let route = stages.contains(&0);
        let one = m.route_one.as_ref().filter(|_| t == 1 && e <= 128);
        if let Some(f) = one.filter(|_| route) {
            // One token: routing and alignment by one warp.
            let mut b = self.launcher(&f[bf]);
            b.arg(&pl).arg(&pids).arg(&pw).arg(&porder).arg(&ptiles);
            b.arg(&e32).arg(&k32).arg(&n32).arg(&mt32);
            // SAFETY: argument types match `moe_route_one_*`; buffers sized and checked above
            // (k <= 32, e <= 128).
            unsafe { b.launch(grid(1, 1, 32, 0)) }.w()?;
        } else if route && t <= 32 {
            // Route (warp w: token w) and align in one block.
            let mut b = self.launcher(&m.route_align[bf]);
            b.arg(&pl).arg(&pids).arg(&pw).arg(&porder).arg(&ptiles);
            b.arg(&t32)
                .arg(&e32)
                .arg(&k32)
                .arg(&n32)
                .arg(&tm32)
                .arg(&mt32);
            // SAFETY: argument types match `moe_route_align_*`; buffers sized and checked
            // above; 2 * e ints of dynamic shared memory.
            unsafe { b.launch(grid(1, 1, 1024, (2 * e * 4) as u32)) }.w()?;
        } else if route {
            // Route: one warp per token.
            let mut b = self.launcher(&m.route[bf]);
            b.arg(&pl)
                .arg(&pids)
                .arg(&pw)
                .arg(&t32)
                .arg(&e32)
                .arg(&k32)
                .arg(&n32);
            // SAFETY: argument types match `moe_route_*`; buffers sized and checked above.
            unsafe { b.launch(grid(t.div_ceil(8), 1, 256, 0)) }.w()?;
            let mut b = self.launcher(&m.align);
            b.arg(&pids)
                .arg(&porder)
                .arg(&ptiles)
                .arg(&p32)
                .arg(&e32)
                .arg(&tm32)
                .arg(&mt32);
            // SAFETY: as above (`moe_align`: 2 * e ints of dynamic shared memory).
            unsafe { b.launch(grid(1, 1, 1024, (2 * e * 4) as u32)) }.w()?;
        }
        // One-pair tiles may load gate|up evict-first (`LaunchOptions::moe_gate_up_cs`).
        let cs = m.gate_up_cs.as_ref().filter(|_| bf16 && tm == 1);
        if stages.contains(&1) {
            let mut b = self.launcher(match cs {
                Some(f) => f,
                None if mma => &m.mma_gate_up[fi],
                None => &m.simt_gate_up[fi],
            });
            b.arg(&ph).arg(&pgu).arg(&porder).arg(&ptiles).arg(&pact);
            b.arg(&h32).arg(&i32_).arg(&k32).arg(&f32_).arg(&l32);
            // SAFETY: as above (`moe_gate_up_t*`; `moe_gate_up_t1_cs_bf16` the same arguments;
            // `moe_gate_up_m*_bf16`: 32 gate and 32 up rows a block of 128 threads).
            let cfg = if mma {
                grid(inter / 32, max_tiles, 128, 0)
            } else {
                grid(inter.div_ceil(8), max_tiles, 256, 0)
            };
            unsafe { b.launch(cfg) }.w()?;
        }
        let fused = tm == 1 && stages.contains(&2) && stages.contains(&3);
        if let Some(f) = m.down_sum.as_ref().filter(|_| fused) {
            // Down and the sum in one launch (one-pair tiles, `LaunchOptions::moe_down_sum`).
            let mut b = self.launcher(f);
            b.arg(&pact).arg(&pdn).arg(&pids).arg(&porder).arg(&pw);
            b.arg(&pout)
                .arg(&h32)
                .arg(&i32_)
                .arg(&k32)
                .arg(&f32_)
                .arg(&l32);
            // SAFETY: argument types match `moe_down_sum_bf16` (bf16: `down_sum` is loaded for
            // bf16 only); buffers sized and checked above (k <= 32); a warp per output row.
            unsafe { b.launch(grid(hidden.div_ceil(8), t, 256, 0)) }.w()?;
            return Ok(());
        }
        if stages.contains(&2) {
            let mut b = self.launcher(if mma {
                &m.mma_down[fi]
            } else {
                &m.simt_down[fi]
            });
            b.arg(&pact)
                .arg(&pdn)
                .arg(&porder)
                .arg(&ptiles)
                .arg(&pw)
                .arg(&py);
            b.arg(&h32).arg(&i32_).arg(&f32_).arg(&l32);
            // SAFETY: as above (`moe_down_t*`; `moe_down_m*_bf16`: 64 outputs a block of 128;
            // `moe_down_t1_bf16`: 4 rows a warp).
            let rows = if tm == 1 { 4 } else { 1 };
            let cfg = if mma {
                grid(hidden / 64, max_tiles, 128, 0)
            } else {
                grid(hidden.div_ceil(8 * rows), max_tiles, 256, 0)
            };
            unsafe { b.launch(cfg) }.w()?;
        }
        if !stages.contains(&3) {
            return Ok(());
        }
        let mut b = self.launcher(&m.sum[bf]);
        b.arg(&py)
            .arg(&pids)
            .arg(&pout)
            .arg(&h32)
            .arg(&k32)
            .arg(&f32_)
            .arg(&l32);
        // SAFETY: as above (`moe_sum_*`).
        unsafe { b.launch(grid(t, hidden.div_ceil(256), 256, 0)) }.w()?;
        Ok(())
    }
}
