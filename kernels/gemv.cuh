// Helpers of the skinny matmuls (`gemv.cu`, `gemv_mma.cu`): a warp's batches of weight loads,
// the dot products over them, the block-wide fused norms and the stores (in an anonymous
// namespace, so each kernel file has its own), then the kernels' entry-point macros.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "common.cuh"

namespace {

constexpr int WARPS = 8;   // warps per block
constexpr int BATCH = 8;   // chunk loads a lane keeps in flight

// A weight chunk, streamed past L1. Built with WEIGHT_EVICT_FIRST (build.rs: gemv_ef /
// gemv_mma_ef, LaunchOptions::weight_evict_first) the load also marks its L2 line evict-first
// (an L2 cache policy; ptxas makes the policy once a kernel): a step reads each weight once, and
// so marked the weights streaming through L2 leave the lines other kernels read there (on the
// H200 0.6B batch 8 +11.6%, batch 1 flat; which lines gain is not yet measured).
__device__ __forceinline__ uint4 ld_stream(const __nv_bfloat16* p) {
  uint4 v;
#ifdef WEIGHT_EVICT_FIRST
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
#else
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
#endif
  return v;
}

// w[r][i] = chunk c0 + 32 * i of row rows[r] (zeros past the row's end).
template <int NR>
__device__ __forceinline__ void load_batch(const __nv_bfloat16* __restrict__ W,
                                           const int (&rows)[NR], int K, int c0,
                                           uint4 (&w)[NR][BATCH]) {
  const int chunks = K / 8;
#pragma unroll
  for (int i = 0; i < BATCH; ++i) {
    const int c = c0 + 32 * i;
#pragma unroll
    for (int r = 0; r < NR; ++r)
      w[r][i] = c < chunks ? ld_stream(W + (size_t)rows[r] * K + c * 8) : make_uint4(0, 0, 0, 0);
  }
}

// Chunk c (8 elements) of token row t of the matmul's input: read as is (x rows K apart, in
// global or shared memory), or with the warp's own norm (WarpNorm) computed on the fly.
struct PlainX {
  const __nv_bfloat16* x;
  int K;
  __device__ __forceinline__ uint4 chunk(int t, int c) const {
    return *reinterpret_cast<const uint4*>(x + (size_t)t * K + c * 8);
  }
};

// acc[r][t] += W[rows[r]] . x[t] over chunk c (8 inputs), the weights in slot i of w.
template <int T, int NR, typename X>
__device__ __forceinline__ void sum_chunk(const X& xs, int c, const uint4 (&w)[NR][BATCH], int i,
                                          float (&acc)[NR][T]) {
  float wf[NR][8];
#pragma unroll
  for (int r = 0; r < NR; ++r) bf16x8_to_f32(w[r][i], wf[r]);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float xf[8];
    bf16x8_to_f32(xs.chunk(t, c), xf);
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r][t] = fmaf(wf[r][j], xf[j], acc[r][t]);
  }
}

// acc[r][t] += W[rows[r]] . x[t] over one batch: chunks c0, c0 + 32, ... (below `chunks`), the
// weights in w.
template <int T, int NR, typename X>
__device__ __forceinline__ void sum_batch(const X& xs, int c0, int chunks,
                                          const uint4 (&w)[NR][BATCH], float (&acc)[NR][T]) {
#pragma unroll
  for (int i = 0; i < BATCH; ++i) {
    const int c = c0 + 32 * i;
    if (c >= chunks) break;
    sum_chunk<T, NR>(xs, c, w, i, acc);
  }
}

// acc[r][t] = W[rows[r]] . x[t] for NR rows (all < N), x chunks from `xs`; w holds the first
// batch (load_batch at c0 = lane), loaded by the caller before it waited.
template <int T, int NR, typename X>
__device__ __forceinline__ void dot_rows(const __nv_bfloat16* __restrict__ W, const X& xs,
                                         const int (&rows)[NR], int K, int lane,
                                         uint4 (&w)[NR][BATCH], float (&acc)[NR][T]) {
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
  const int chunks = K / 8;
  for (int c0 = lane; c0 < chunks; c0 += 32 * BATCH) {
    if (c0 != lane) load_batch<NR>(W, rows, K, c0, w);
    sum_batch<T, NR>(xs, c0, chunks, w, acc);
  }
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
}

// Elements a thread of the deferred norms loads before it sums and stores any of them.
constexpr int NORM_LOADS = 4;

// inv[t] = 1 / rms of row t over K inputs from each thread's partial sum of squares: the
// warps' sums through shared memory behind one block barrier, added in one order by every
// thread (the norms below all end their first pass here).
template <int T>
__device__ __forceinline__ void block_inv_rms(const float (&part)[T], int K, float eps,
                                              float (&inv)[T]) {
  __shared__ float ss[WARPS][T];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float s = warp_sum(part[t]);
    if (lane == 0) ss[warp][t] = s;
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) tot += ss[i][t];
    inv[t] = rsqrtf(tot / K + eps);
  }
}

// x_s[t][k] = bf16(bf16(res + delta) * inv_rms(t) * w[k]) for the block, in shared memory;
// block 0 writes bf16(res + delta) to res_out when add.
template <int T>
__device__ void norm_rows(const __nv_bfloat16* __restrict__ res,
                          const __nv_bfloat16* __restrict__ delta,
                          __nv_bfloat16* __restrict__ res_out, const __nv_bfloat16* __restrict__ w,
                          float eps, int add, int K, __nv_bfloat16* x_s) {
  float part[T];
#pragma unroll
  for (int t = 0; t < T; ++t) part[t] = 0.f;
  for (int k = threadIdx.x; k < K; k += WARPS * 32) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float v = __bfloat162float(res[(size_t)t * K + k]);
      if (add) v = __bfloat162float(__float2bfloat16(v + __bfloat162float(delta[(size_t)t * K + k])));
      x_s[t * K + k] = __float2bfloat16(v);  // the summed residual, normed below
      part[t] += v * v;
    }
  }
  float inv[T];
  block_inv_rms<T>(part, K, eps, inv);
  for (int k = threadIdx.x; k < K; k += WARPS * 32) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const __nv_bfloat16 r = x_s[t * K + k];
      if (add && blockIdx.x == 0) res_out[(size_t)t * K + k] = r;
      x_s[t * K + k] = __float2bfloat16(__bfloat162float(r) * inv[t] * __bfloat162float(w[k]));
    }
  }
  __syncthreads();
}

// The norm with its scale deferred (LaunchOptions::norm_deferred): x_s[t][k] = bf16(bf16(res +
// delta) * w[k]) and inv[t] = inv_rms(t), one pass and one block barrier; the caller scales
// its dot products by inv[t] (linear in x), where norm_rows scales every input in a second
// pass behind a second barrier. One rounding of the input row either way (at another scale).
// Block 0 writes bf16(res + delta) to res_out when add.
template <int T>
__device__ void norm_rows_deferred(const __nv_bfloat16* __restrict__ res,
                                   const __nv_bfloat16* __restrict__ delta,
                                   __nv_bfloat16* __restrict__ res_out,
                                   const __nv_bfloat16* __restrict__ w, float eps, int add, int K,
                                   __nv_bfloat16* x_s, float (&inv)[T]) {
  float part[T];
#pragma unroll
  for (int t = 0; t < T; ++t) part[t] = 0.f;
  // NORM_LOADS elements a thread at a time: all their loads, then the sums and stores (the
  // same order), so block 0's res_out stores do not hold each next load behind them.
  for (int k0 = threadIdx.x; k0 < K; k0 += NORM_LOADS * WARPS * 32) {
    float wk[NORM_LOADS], rv[NORM_LOADS][T], dv[NORM_LOADS][T];
#pragma unroll
    for (int u = 0; u < NORM_LOADS; ++u) {
      const int k = k0 + u * WARPS * 32;
      const bool in = k < K;
      wk[u] = in ? __bfloat162float(w[k]) : 0.f;
#pragma unroll
      for (int t = 0; t < T; ++t) {
        rv[u][t] = in ? __bfloat162float(res[(size_t)t * K + k]) : 0.f;
        dv[u][t] = in && add ? __bfloat162float(delta[(size_t)t * K + k]) : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < NORM_LOADS; ++u) {
      const int k = k0 + u * WARPS * 32;
      if (k >= K) break;
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float v = rv[u][t];
        if (add) {
          const __nv_bfloat16 s = __float2bfloat16(v + dv[u][t]);
          if (blockIdx.x == 0) res_out[(size_t)t * K + k] = s;
          v = __bfloat162float(s);
        }
        x_s[t * K + k] = __float2bfloat16(v * wk[u]);
        part[t] += v * v;
      }
    }
  }
  block_inv_rms<T>(part, K, eps, inv);
}

// acc[r][t] *= inv[t]: a deferred norm's scale on finished dot products.
template <int T, int NR>
__device__ __forceinline__ void scale_rows(float (&acc)[NR][T], const float (&inv)[T]) {
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] *= inv[t];
}

// out[t][row] = acc (NR 1) or silu(gate) * up (NR 2), written by lane t.
template <int T, int NR>
__device__ __forceinline__ void store_rows(const float (&acc)[NR][T], __nv_bfloat16* __restrict__ out,
                                           int N, int row, int lane) {
#pragma unroll
  for (int t = 0; t < T; ++t)
    if (lane == t) {
      float v = acc[0][t];
      if (NR == 2) v = v / (1.f + __expf(-v)) * acc[NR - 1][t];
      out[(size_t)t * N + row] = __float2bfloat16(v);
    }
}

}  // namespace

// The kernels' entry points (gemv.cu, gemv_mma.cu). Every kernel takes one of two argument lists: a plain matmul's (W, x, out,
// N, K, pf, pf_bytes) or a norm kernel's (W, res, delta, res_out, nw, eps, add, out, N, K, pf,
// pf_bytes), whose normed rows live in dynamic shared memory (x_s). N is I (the pairs) for the
// SiLU kernels.
// The entries' launch bounds (a file may redefine it around some entries).
#define ENTRY_BOUNDS __launch_bounds__(WARPS * 32)
// Built with X_SHARED (build.rs gemv_ef_xs, LaunchOptions::gemv_x_shared) a plain entry owns
// XS_MAX bf16 of static shared memory, where gemv.cu's 1-2-row kernels copy their input right
// after the wait (one round of loads) instead of loading it chunk by chunk in the loop.
#ifdef X_SHARED
constexpr int XS_MAX = 2 * 6144;
#define PLAIN_XS                                        \
  __shared__ __align__(16) __nv_bfloat16 xs_in[XS_MAX]; \
  [[maybe_unused]] __nv_bfloat16* x_s = xs_in;
#else
#define PLAIN_XS [[maybe_unused]] __nv_bfloat16* x_s = nullptr;
#endif
#define PLAIN_ENTRY(NAME, ...)                                                               \
  extern "C" __global__ void ENTRY_BOUNDS NAME(                                              \
      const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* out, int N, int K,      \
      const void* pf, unsigned long long pf_bytes) {                                         \
    (void)pf;                                                                                \
    (void)pf_bytes;                                                                          \
    PLAIN_XS                                                                                 \
    __VA_ARGS__;                                                                             \
  }
#define NORM_ENTRY(NAME, ...)                                                                \
  extern "C" __global__ void ENTRY_BOUNDS NAME(                                              \
      const __nv_bfloat16* W, const __nv_bfloat16* res, const __nv_bfloat16* delta,          \
      __nv_bfloat16* res_out, const __nv_bfloat16* nw, float eps, int add,                   \
      __nv_bfloat16* out, int N, int K, const void* pf, unsigned long long pf_bytes) {       \
    extern __shared__ __align__(16) __nv_bfloat16 x_s[];                                     \
    (void)x_s;                                                                               \
    __VA_ARGS__;                                                                             \
  }
// The arguments a body passes on: a plain matmul's (no norm) and a norm kernel's.
#define PLAIN_ARGS W, x, nullptr, nullptr, nullptr, 0.f, 0, out, N, K, x_s, pf, pf_bytes
#define NORM_ARGS W, res, delta, res_out, nw, eps, add, out, N, K, x_s, pf, pf_bytes
