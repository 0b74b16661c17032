// Skinny matmuls of decode steps (T <= 2 token rows), bf16 weights and activations, f32
// accumulation: out[t][n] = sum_k x[t][k] * W[n][k] for a row-major weight W [N, K] (a linear
// layer's layout). At so few rows a step is bound by reading W once and by latency, so each kernel
// does as much of the layer as it can in one launch.
//
// A warp takes one output row (two for the gate/up pair): each lane loads 16 bytes (8
// weights) per chunk, up to 8 chunks in flight (streamed past L1), multiplies them by the same
// 8 elements of each of the T activation rows and accumulates in f32; a warp reduction ends
// the row. Blocks hold 8 warps. K must be a multiple of 8 (16-byte aligned rows).
//
// The weights are the only memory no kernel of a step writes, so each warp issues its first
// batch of weight loads before waiting on the kernel before it (programmatic dependent launch,
// common.cuh): in a chain of launches a matmul's weight reads overlap the previous kernel.
//
//  * gemv_t{T}_bf16:        out [T, N] = x W^T
//  * gemv_silu_t{T}_bf16:   W is gate|up [2I, K]; out [T, I] = silu(x gate^T) * (x up^T)
//  * norm_gemv_t{T}_bf16, norm_gemv_silu_t{T}_bf16: the same on x = rmsnorm(res + delta) * w,
//    computed by every block into shared memory (K <= 4096); block 0 also writes
//    res + delta (rounded to bf16, as the residual stream is stored) to res_out, a buffer other
//    than res (no block may see another's write). Without delta (add == 0) res is normed as
//    is and res_out is not written.

#include <cuda_bf16.h>
#include <stdint.h>

#include "common.cuh"

namespace {

constexpr int WARPS = 8;   // warps per block
constexpr int BATCH = 8;   // chunk loads a lane keeps in flight

__device__ __forceinline__ uint4 ld_stream(const __nv_bfloat16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
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

// acc[r][t] = W[rows[r]] . x[t] for NR rows (all < N), x rows K apart (global or shared);
// w holds the first batch (load_batch at c0 = lane), loaded by the caller before it waited.
template <int T, int NR>
__device__ __forceinline__ void dot_rows(const __nv_bfloat16* __restrict__ W,
                                         const __nv_bfloat16* x, const int (&rows)[NR], int K,
                                         int lane, uint4 (&w)[NR][BATCH], float (&acc)[NR][T]) {
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
  const int chunks = K / 8;
  for (int c0 = lane; c0 < chunks; c0 += 32 * BATCH) {
    if (c0 != lane) load_batch<NR>(W, rows, K, c0, w);
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int c = c0 + 32 * i;
      if (c >= chunks) break;
      float wf[NR][8];
#pragma unroll
      for (int r = 0; r < NR; ++r) bf16x8_to_f32(w[r][i], wf[r]);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float xf[8];
        bf16x8_to_f32(*reinterpret_cast<const uint4*>(x + (size_t)t * K + c * 8), xf);
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r][t] = fmaf(wf[r][j], xf[j], acc[r][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
}

// x_s[t][k] = bf16(bf16(res + delta) * inv_rms(t) * w[k]) for the block, in shared memory;
// block 0 writes bf16(res + delta) to res_out when add.
template <int T>
__device__ void norm_rows(const __nv_bfloat16* __restrict__ res,
                          const __nv_bfloat16* __restrict__ delta,
                          __nv_bfloat16* __restrict__ res_out, const __nv_bfloat16* __restrict__ w,
                          float eps, int add, int K, __nv_bfloat16* x_s) {
  __shared__ float ss[WARPS][T];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
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
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float s = warp_sum(part[t]);
    if (lane == 0) ss[warp][t] = s;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < K; k += WARPS * 32) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float tot = 0.f;
#pragma unroll
      for (int i = 0; i < WARPS; ++i) tot += ss[i][t];
      const float inv = rsqrtf(tot / K + eps);
      const __nv_bfloat16 r = x_s[t * K + k];
      if (add && blockIdx.x == 0) res_out[(size_t)t * K + k] = r;
      x_s[t * K + k] = __float2bfloat16(__bfloat162float(r) * inv * __bfloat162float(w[k]));
    }
  }
  __syncthreads();
}

// The output rows of this warp: one row (NR 1) or a gate/up pair (NR 2, up at N + row), and
// whether the warp has one (a block's last warps may not).
template <int NR>
__device__ __forceinline__ bool warp_rows(int N, int (&rows)[NR]) {
  const int row = blockIdx.x * WARPS + threadIdx.x / 32;
  const bool ok = row < N;
#pragma unroll
  for (int r = 0; r < NR; ++r) rows[r] = ok ? row + r * N : 0;
  return ok;
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

// The whole kernel: triggers the next launch, prefetches this warp's first weight batch,
// waits for the previous kernel, optionally norms the input rows into shared memory, then
// runs the dot products. NR 2 is the gate/up pair with SiLU (N = I).
template <int T, int NR, bool NORM>
__device__ __forceinline__ void gemv_kernel(const __nv_bfloat16* __restrict__ W,
                                            const __nv_bfloat16* x,
                                            const __nv_bfloat16* __restrict__ delta,
                                            __nv_bfloat16* __restrict__ res_out,
                                            const __nv_bfloat16* __restrict__ nw, float eps,
                                            int add, __nv_bfloat16* __restrict__ out, int N,
                                            int K, __nv_bfloat16* x_s) {
  pdl_trigger();
  const int lane = threadIdx.x % 32;
  int rows[NR];
  const bool ok = warp_rows<NR>(N, rows);
  uint4 w[NR][BATCH];
  if (ok) load_batch<NR>(W, rows, K, lane, w);
  pdl_wait();
  if (NORM) {
    norm_rows<T>(x, delta, res_out, nw, eps, add, K, x_s);
    x = x_s;
  }
  if (!ok) return;
  float acc[NR][T];
  dot_rows<T, NR>(W, x, rows, K, lane, w, acc);
  store_rows<T, NR>(acc, out, N, rows[0], lane);
}

}  // namespace

#define GEMV(T)                                                                              \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) gemv_t##T##_bf16(                 \
      const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* out, int N, int K) {    \
    gemv_kernel<T, 1, false>(W, x, nullptr, nullptr, nullptr, 0.f, 0, out, N, K, nullptr);   \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) gemv_silu_t##T##_bf16(            \
      const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* out, int I, int K) {    \
    gemv_kernel<T, 2, false>(W, x, nullptr, nullptr, nullptr, 0.f, 0, out, I, K, nullptr);   \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) norm_gemv_t##T##_bf16(            \
      const __nv_bfloat16* W, const __nv_bfloat16* res, const __nv_bfloat16* delta,          \
      __nv_bfloat16* res_out, const __nv_bfloat16* nw, float eps, int add,                   \
      __nv_bfloat16* out, int N, int K) {                                                    \
    extern __shared__ __align__(16) __nv_bfloat16 x_s[];                                     \
    gemv_kernel<T, 1, true>(W, res, delta, res_out, nw, eps, add, out, N, K, x_s);           \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) norm_gemv_silu_t##T##_bf16(       \
      const __nv_bfloat16* W, const __nv_bfloat16* res, const __nv_bfloat16* delta,          \
      __nv_bfloat16* res_out, const __nv_bfloat16* nw, float eps, int add,                   \
      __nv_bfloat16* out, int I, int K) {                                                    \
    extern __shared__ __align__(16) __nv_bfloat16 x_s[];                                     \
    gemv_kernel<T, 2, true>(W, res, delta, res_out, nw, eps, add, out, I, K, x_s);           \
  }

GEMV(1)
GEMV(2)
