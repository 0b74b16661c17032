// Skinny matmuls of decode steps (T <= 8 token rows), bf16 weights and activations, f32
// accumulation: out[t][n] = sum_k x[t][k] * W[n][k] for a row-major weight W [N, K] (a linear
// layer's layout). At T <= 8 a step is bound by reading W once; cuBLAS's tiled kernels for
// these shapes leave much of the bandwidth unused and cost a separate launch for SiLU*up.
//
// A warp takes R consecutive output rows. Each lane loads 16 bytes (8 weights) of each of its
// R rows per iteration (R independent loads in flight, streamed past L1), multiplies them by
// the same 8 elements of each of the T activation rows (read through the cache: all warps
// share them), and accumulates in f32; a warp reduction ends each row. K must be a multiple
// of 8 and the rows 16-byte aligned (K % 8 == 0 gives both for a contiguous W).
//
//  * gemv_t{T}_bf16:        out [T, N]
//  * gemv_silu_t{T}_bf16:   W is gate|up [2I, K]; out [T, I] = silu(gate . x) * (up . x)

#include <cuda_bf16.h>
#include <stdint.h>

namespace {

constexpr int WARPS = 8;  // warps per block
constexpr int R = 4;      // output rows per warp (gemv); gate/up pairs per warp: R / 2

__device__ __forceinline__ uint4 ld_stream(const __nv_bfloat16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void to_f8(uint4 raw, float* out) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ float dot8(uint4 w, const float* x) {
  float wf[8];
  to_f8(w, wf);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = fmaf(wf[i], x[i], s);
  return s;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// acc[r][t] += W[rows[r]] . x[t] over K; rows past N (rows[r] < 0) read nothing.
template <int T, int NR>
__device__ __forceinline__ void dot_rows(const __nv_bfloat16* __restrict__ W,
                                         const __nv_bfloat16* __restrict__ x, const int* rows,
                                         int K, int lane, float (&acc)[NR][T]) {
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
#pragma unroll 2
  for (int k = lane * 8; k < K; k += 32 * 8) {
    uint4 w[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (rows[r] >= 0) {
        w[r] = ld_stream(W + (size_t)rows[r] * K + k);
      } else {
        w[r] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float xf[8];
      to_f8(__ldg(reinterpret_cast<const uint4*>(x + (size_t)t * K + k)), xf);
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[r][t] += dot8(w[r], xf);
    }
  }
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
}

template <int T>
__device__ void gemv(const __nv_bfloat16* __restrict__ W, const __nv_bfloat16* __restrict__ x,
                     __nv_bfloat16* __restrict__ out, int N, int K) {
  const int warp = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = warp * R;
  if (row0 >= N) return;
  int rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = row0 + r < N ? row0 + r : -1;
  float acc[R][T];
  dot_rows<T, R>(W, x, rows, K, lane, acc);
  // Lane (r * T + t) % 32 writes element (t, row0 + r).
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t)
      if (lane == (r * T + t) % 32 && rows[r] >= 0)
        out[(size_t)t * N + rows[r]] = __float2bfloat16(acc[r][t]);
}

template <int T>
__device__ void gemv_silu(const __nv_bfloat16* __restrict__ W,
                          const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ out,
                          int I, int K) {
  constexpr int P = R / 2;  // gate/up pairs per warp
  const int warp = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j0 = warp * P;
  if (j0 >= I) return;
  int rows[R];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    bool ok = j0 + p < I;
    rows[p] = ok ? j0 + p : -1;          // gate row
    rows[P + p] = ok ? I + j0 + p : -1;  // up row
  }
  float acc[R][T];
  dot_rows<T, R>(W, x, rows, K, lane, acc);
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int t = 0; t < T; ++t)
      if (lane == (p * T + t) % 32 && rows[p] >= 0) {
        float g = acc[p][t], u = acc[P + p][t];
        out[(size_t)t * I + j0 + p] = __float2bfloat16(g / (1.f + __expf(-g)) * u);
      }
}

}  // namespace

#define GEMV(T)                                                                              \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) gemv_t##T##_bf16(                 \
      const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* out, int N, int K) {    \
    gemv<T>(W, x, out, N, K);                                                                \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) gemv_silu_t##T##_bf16(            \
      const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* out, int I, int K) {    \
    gemv_silu<T>(W, x, out, I, K);                                                           \
  }

GEMV(1)
GEMV(2)
GEMV(3)
GEMV(4)
GEMV(5)
GEMV(6)
GEMV(7)
GEMV(8)
