// The gate|up kernels' loops on streamed rows (`gemv.cu` `sgemv_silu_*`, `snorm_gemv_silu_*`,
// `sdnorm_gemv_silu_*`; LaunchOptions::gemv_stream): one family, apart from gemv.cu's other
// skinny matmuls, whose helpers (gemv.cuh) it shares.
#pragma once

#include "gemv.cuh"

namespace {

// The gate|up kernels (NR 2) of gemv.cu's gemv_kernel, bit for bit, on a grid sized to the GPU instead of
// to the rows: warp gw of the G in the grid takes row pairs gw, gw + G, ..., and a lane's weight
// loads run in batches of BATCH over its rows' chunks as one sequence (a row's chunks lane,
// lane + 32, ..., as gemv_kernel sums them), so the batch issued before the wait covers up to
// BATCH / ceil(K / 256) rows of each warp: all of a 1,024-wide gate|up at two pairs a warp. The
// norm kernel loads the norm weights into registers before the wait too (K <= NW_REGS * 256).
// (Loads refilled one at a time as each chunk is summed, and the plain and norm kernels of qkv,
// o and down on such grids, were slower on the H200: BENCHMARKS.md, #21.)

constexpr int NW_REGS = 16;  // norm weights a thread holds

// norm_rows with the norm weights already in registers (wk[e] = w[threadIdx.x + 256 e], kept
// as bf16): the same sums in the same order. DEFER: norm_rows_deferred's (x_s scaled by w
// only, in one pass; the scale in inv for the caller).
template <int T, bool DEFER = false>
__device__ void norm_rows_pre(const __nv_bfloat16* __restrict__ res,
                              const __nv_bfloat16* __restrict__ delta,
                              __nv_bfloat16* __restrict__ res_out, const __nv_bfloat16 (&wk)[NW_REGS],
                              float eps, int add, int K, __nv_bfloat16* x_s, float (&inv)[T]) {
  float part[T];
#pragma unroll
  for (int t = 0; t < T; ++t) part[t] = 0.f;
  if constexpr (DEFER) {
    // NORM_LOADS elements at a time: all their loads, then the sums and stores (the same
    // order), so block 0's res_out stores do not hold each next load behind them.
#pragma unroll
    for (int e0 = 0; e0 < NW_REGS; e0 += NORM_LOADS) {
      if (threadIdx.x + e0 * WARPS * 32 >= K) break;
      float rv[NORM_LOADS][T], dv[NORM_LOADS][T];
#pragma unroll
      for (int u = 0; u < NORM_LOADS; ++u) {
        const int k = threadIdx.x + (e0 + u) * WARPS * 32;
#pragma unroll
        for (int t = 0; t < T; ++t) {
          rv[u][t] = k < K ? __bfloat162float(res[(size_t)t * K + k]) : 0.f;
          dv[u][t] = k < K && add ? __bfloat162float(delta[(size_t)t * K + k]) : 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < NORM_LOADS; ++u) {
        const int e = e0 + u, k = threadIdx.x + e * WARPS * 32;
        if (k >= K) break;
#pragma unroll
        for (int t = 0; t < T; ++t) {
          float v = rv[u][t];
          if (add) v = __bfloat162float(__float2bfloat16(v + dv[u][t]));
          if (add && blockIdx.x == 0) res_out[(size_t)t * K + k] = __float2bfloat16(v);
          x_s[t * K + k] = __float2bfloat16(v * __bfloat162float(wk[e]));
          part[t] += v * v;
        }
      }
    }
    block_inv_rms<T>(part, K, eps, inv);
  } else {
#pragma unroll
    for (int e = 0; e < NW_REGS; ++e) {
      const int k = threadIdx.x + e * WARPS * 32;
      if (k < K) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
          float v = __bfloat162float(res[(size_t)t * K + k]);
          if (add) v = __bfloat162float(__float2bfloat16(v + __bfloat162float(delta[(size_t)t * K + k])));
          x_s[t * K + k] = __float2bfloat16(v);
          part[t] += v * v;
        }
      }
    }
    block_inv_rms<T>(part, K, eps, inv);
#pragma unroll
    for (int e = 0; e < NW_REGS; ++e) {
      const int k = threadIdx.x + e * WARPS * 32;
      if (k < K) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
          const __nv_bfloat16 r = x_s[t * K + k];
          if (add && blockIdx.x == 0) res_out[(size_t)t * K + k] = r;
          x_s[t * K + k] = __float2bfloat16(__bfloat162float(r) * inv[t] * __bfloat162float(wk[e]));
        }
      }
    }
    __syncthreads();
  }
}

// Loads the next BATCH slots of this warp's sequence (row lr, chunk lane + 32 lp onwards) into
// w, zeros past a row's end; advances (lr, lp).
template <int NR>
__device__ __forceinline__ void load_slots(const __nv_bfloat16* __restrict__ W, int N, int K,
                                           int gw, int G, int R, int P, int lane, int& lr,
                                           int& lp, uint4 (&w)[NR][BATCH]) {
  const int chunks = K / 8;
#pragma unroll
  for (int i = 0; i < BATCH; ++i) {
    if (lr < R) {
      const int c = lane + 32 * lp;
      const size_t row = (size_t)gw + (size_t)lr * G;
#pragma unroll
      for (int r = 0; r < NR; ++r)
        w[r][i] = c < chunks ? ld_stream(W + (row + (size_t)r * N) * K + c * 8) : make_uint4(0, 0, 0, 0);
      if (++lp == P) { lp = 0; ++lr; }
    }
  }
}

// A warp's last chunk of a row (pair): its sums reduced across the warp, scaled by inv with
// DEFER, stored, and cleared for the warp's next row (the fit loops'; the general loop keeps
// its own copy, through this function ptxas gave the default kernels other machine code).
template <int T, int NR, bool DEFER>
__device__ __forceinline__ void end_row(float (&acc)[NR][T], const float (&inv)[T],
                                        __nv_bfloat16* __restrict__ out, int N, int row,
                                        int lane) {
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
  if (DEFER) scale_rows<T, NR>(acc, inv);
  store_rows<T, NR>(acc, out, N, row, lane);
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
}

// ld_stream into v when `on` (else v unchanged): predicated, not branched around, so the
// compiler keeps each half's refill between the sums around it (a branch let it merge both
// halves' refills behind every sum); the memory clobber keeps the next half's activation
// reads after it.
__device__ __forceinline__ void ld_stream_if(const __nv_bfloat16* p, bool on, uint4& v) {
#ifdef WEIGHT_EVICT_FIRST
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.u32 q, %5, 0;\n"
      " @q ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %6;\n}"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(p), "r"((unsigned)on), "l"(pol)
      : "memory");
#else
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.u32 q, %5, 0;\n"
      " @q ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n}"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(p), "r"((unsigned)on)
      : "memory");
#endif
}

// A 16-byte copy from global into shared memory by cp.async (L2 only; evict-first in L2 in
// the WEIGHT_EVICT_FIRST build, as ld_stream).
__device__ __forceinline__ void cp_async16(uint4* dst, const __nv_bfloat16* src) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
#ifdef WEIGHT_EVICT_FIRST
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(s), "l"(src),
               "l"(pol)
               : "memory");
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
#endif
}

// load_slots into this warp's stage in shared memory (st: NR x BATCH x 32 uint4, slot i of
// row r of lane l at (r * BATCH + i) * 32 + l) by cp.async, one commit group; slots past a
// row's end are not copied (nothing sums them). Advances (lr, lp) as load_slots does.
template <int NR>
__device__ __forceinline__ void stage_slots(const __nv_bfloat16* __restrict__ W, int N, int K,
                                            int gw, int G, int R, int P, int lane, int& lr,
                                            int& lp, uint4* st) {
  const int chunks = K / 8;
#pragma unroll
  for (int i = 0; i < BATCH; ++i) {
    if (lr < R) {
      const int c = lane + 32 * lp;
      const size_t row = (size_t)gw + (size_t)lr * G;
      if (c < chunks) {
#pragma unroll
        for (int r = 0; r < NR; ++r)
          cp_async16(st + (r * BATCH + i) * 32 + lane, W + (row + (size_t)r * N) * K + c * 8);
      }
      if (++lp == P) { lp = 0; ++lr; }
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Shared memory a warp's stage takes (NR 2: the gate|up pairs).
constexpr int STAGE_BYTES = 2 * BATCH * 32 * 16;

// The fit form's loads: rows r0 .. r0 + BATCH / FIT - 1 of this warp's sequence (those below
// R), FIT chunks each, into the slots load_slots would fill, in its order.
template <int NR, int FIT>
__device__ __forceinline__ void fit_rows(const __nv_bfloat16* __restrict__ W, int N, int K, int gw,
                                         int G, int R, int r0, int lane, uint4 (&w)[NR][BATCH]) {
#pragma unroll
  for (int j = 0; j < BATCH / FIT; ++j) {
    if (r0 + j < R) {
      const size_t row = (size_t)gw + (size_t)(r0 + j) * G;
#pragma unroll
      for (int q = 0; q < FIT; ++q)
#pragma unroll
        for (int r = 0; r < NR; ++r)
          w[r][j * FIT + q] = ld_stream(W + (row + (size_t)r * N) * K + (lane + 32 * q) * 8);
    }
  }
}

// FIT > 0 (gemv.cu's 2-row kernels at 1,024 and 2,048 inputs): K is exactly 256 * FIT, so a
// batch holds BATCH / FIT whole rows of the warp's sequence, each row's end on a fixed slot;
// the loop runs a row at a time and its reduction and store are compiled BATCH / FIT times
// instead of BATCH. PIPE (with FIT == BATCH): the batch's halves refilled as summed, below.
// The same loads, sums and order.
//
// STAGE (LaunchOptions::gemv_stream_stage, 1 row, the general loop): x_s is the dynamic shared
// memory, the WARPS warps' stages (STAGE_BYTES each) first and the normed rows after; a warp's
// second batch goes into its stage by cp.async before the wait, and its third batch's loads are
// issued before the second is summed (on an H100 1.7B batch 1 +2.0%; the third prefetched into
// L2 before the wait as well lost 2.8%, the third's first half staged too 3.2%, three batches
// staged in a qkv of one block an SM 10%: BENCHMARKS.md round 59; the copies issued after the
// wait instead 1.5%: round 60). The same sums in the same order.
template <int T, int NR, bool NORM, bool DEFER = false, int FIT = 0, bool PIPE = false,
          bool STAGE = false>
__device__ __forceinline__ void sgemv_kernel(const __nv_bfloat16* __restrict__ W,
                                             const __nv_bfloat16* x,
                                             const __nv_bfloat16* __restrict__ delta,
                                             __nv_bfloat16* __restrict__ res_out,
                                             const __nv_bfloat16* __restrict__ nw, float eps,
                                             int add, __nv_bfloat16* __restrict__ out, int N,
                                             int K, __nv_bfloat16* x_s, const void* pf,
                                             unsigned long long pf_bytes) {
  static_assert(!PIPE || FIT == BATCH, "the halves are refilled only with one row a batch");
  static_assert(!STAGE || (FIT == 0 && NR == 2), "the stage: the general loop's gate|up");
  pdl_trigger();
  l2_prefetch_share(pf, pf_bytes);
  const int lane = threadIdx.x % 32;
  const int G = gridDim.x * WARPS;
  const int gw = blockIdx.x * WARPS + threadIdx.x / 32;
  uint4* st = nullptr;
  if constexpr (STAGE) {
    st = reinterpret_cast<uint4*>(x_s) + (threadIdx.x / 32) * (STAGE_BYTES / 16);
    x_s += WARPS * STAGE_BYTES / 2;
  }
  const int chunks = K / 8;
  const int P = (chunks + 31) / 32;                  // chunks of a row per lane (padded)
  const int R = gw < N ? (N - 1 - gw) / G + 1 : 0;   // rows of this warp
  const int total = R * P;
  int lr = 0, lp = 0;  // the next slot to load
  uint4 w[NR][BATCH];
  if constexpr (FIT > 0) fit_rows<NR, FIT>(W, N, K, gw, G, R, 0, lane, w);
  else load_slots<NR>(W, N, K, gw, G, R, P, lane, lr, lp, w);
  if constexpr (STAGE) stage_slots<NR>(W, N, K, gw, G, R, P, lane, lr, lp, st);
  __nv_bfloat16 wk[NW_REGS];
  if (NORM) {
#pragma unroll
    for (int e = 0; e < NW_REGS; ++e) {
      const int k = threadIdx.x + e * WARPS * 32;
      wk[e] = k < K ? nw[k] : __float2bfloat16(0.f);
    }
  }
  pdl_wait();
  float inv[T];
  if (NORM) {
    norm_rows_pre<T, DEFER>(x, delta, res_out, wk, eps, add, K, x_s, inv);
    x = x_s;
  }
  float acc[NR][T];
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
  const PlainX xs{x, K};
  // PIPE, one row a batch (FIT == BATCH: 1.7B's 2-row gate|up): each half of the batch
  // refilled with the next row's chunks as soon as it is summed, so a warp keeps loads in
  // flight while it sums instead of a batch's round trip after its sums; two groups of loads
  // outstanding at a time (a load refilled per chunk outran the warp's scoreboards,
  // BENCHMARKS.md round 25). The same sums in the same order.
  if constexpr (PIPE && FIT == BATCH) {
    constexpr int H = BATCH / 2;
    for (int r0 = 0; r0 < R; ++r0) {
      const bool more = r0 + 1 < R;
      const size_t next = (size_t)gw + (size_t)(r0 + 1) * G;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int q = h * H; q < (h + 1) * H; ++q) sum_chunk<T, NR>(xs, lane + 32 * q, w, q, acc);
#pragma unroll
        for (int q = h * H; q < (h + 1) * H; ++q)
#pragma unroll
          for (int r = 0; r < NR; ++r)
            ld_stream_if(W + (next + (size_t)r * N) * K + (lane + 32 * q) * 8, more, w[r][q]);
        __syncwarp();  // no load or shared read moves across: the refill stays between the sums
      }
      end_row<T, NR, DEFER>(acc, inv, out, N, gw + r0 * G, lane);
    }
    return;
  }
  if constexpr (FIT > 0) {
    constexpr int RB = BATCH / FIT;
    for (int r0 = 0; r0 < R; r0 += RB) {
      if (r0 != 0) fit_rows<NR, FIT>(W, N, K, gw, G, R, r0, lane, w);
#pragma unroll
      for (int j = 0; j < RB; ++j) {
        if (r0 + j >= R) break;
#pragma unroll
        for (int q = 0; q < FIT; ++q) sum_chunk<T, NR>(xs, lane + 32 * q, w, j * FIT + q, acc);
        end_row<T, NR, DEFER>(acc, inv, out, N, gw + (r0 + j) * G, lane);
      }
    }
    return;
  }
  int cr = 0, cp = 0;  // the slot being summed: row cr, chunk lane + 32 * cp
  if constexpr (STAGE) {
    // Slot i of the batch at `base`, its weights in v[.][i]: summed, and the row ended at its
    // last chunk (the general loop's steps below).
    auto slot = [&](const uint4 (&v)[NR][BATCH], int i) {
      const int c = lane + 32 * cp;
      if (c < chunks) sum_chunk<T, NR>(xs, c, v, i, acc);
      if (++cp == P) {
        end_row<T, NR, DEFER>(acc, inv, out, N, gw + cr * G, lane);
        cp = 0;
        ++cr;
      }
    };
    for (int base = 0; base < total; base += BATCH) {
      if (base == BATCH) {
        // The staged batch: the next one's loads first, then the stage's slots as summed.
        if (2 * BATCH < total) load_slots<NR>(W, N, K, gw, G, R, P, lane, lr, lp, w);
        asm volatile("cp.async.wait_all;" ::: "memory");
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {
          if (base + i >= total) break;
          uint4 v[NR][BATCH];
#pragma unroll
          for (int r = 0; r < NR; ++r) v[r][i] = st[(r * BATCH + i) * 32 + lane];
          slot(v, i);
        }
        continue;
      }
      if (base > 2 * BATCH) load_slots<NR>(W, N, K, gw, G, R, P, lane, lr, lp, w);
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        if (base + i >= total) break;
        slot(w, i);
      }
    }
  } else {
  for (int base = 0; base < total; base += BATCH) {
    if (base != 0) load_slots<NR>(W, N, K, gw, G, R, P, lane, lr, lp, w);
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      if (base + i >= total) break;
      const int c = lane + 32 * cp;
      if (c < chunks) sum_chunk<T, NR>(xs, c, w, i, acc);
      if (++cp == P) {  // the row's last chunk: reduce, store, next row
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
          for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
        if (DEFER) scale_rows<T, NR>(acc, inv);
        store_rows<T, NR>(acc, out, N, gw + cr * G, lane);
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
          for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
        cp = 0;
        ++cr;
      }
    }
  }
  }
}

}  // namespace
