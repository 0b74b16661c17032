// A sparse layer's router on the device (launcher: src/engine/cuda/moe_router.rs), an
// alternative to the dense kernels' add+RMSNorm and linear in front of moe_route.cu's routing:
//  * moe_norm_router_t{1,2}: for decode steps of 1-2 tokens (LaunchOptions::moe_norm_router),
//                 the add+RMSNorm before the router and the router's matmul in one launch.
// (One token's router matmul and routing in one cluster launch, with and without the norm,
// measured flat or slower on the H100 in round 50 and removed: BENCHMARKS.md, #29.)
#include <cuda_bf16.h>
#include <stdint.h>

#include "common.cuh"
#include "gemv.cuh"

// The add+RMSNorm in front of a sparse layer's router and the router's matmul, one launch for
// 1-2 token rows (bf16; LaunchOptions::moe_norm_router). Grid (ceil(E / 8)), 256 threads,
// T * K bf16 of dynamic shared memory (K <= 4096): every block norms the rows into shared
// memory as add_rmsnorm rounds them (bf16(res + delta), then bf16(sum * inv_rms * w)); block 0
// writes the sums to res_out (with add) and the normed rows to h (the experts' input); warp w
// of block b then takes router row b * 8 + w: logits[t][row] = bf16(h[t] . W[row]).
template <int T>
__device__ void norm_router(const __nv_bfloat16* __restrict__ W, const __nv_bfloat16* res,
                            const __nv_bfloat16* __restrict__ delta, __nv_bfloat16* res_out,
                            const __nv_bfloat16* __restrict__ nw, float eps, int add,
                            __nv_bfloat16* __restrict__ h, __nv_bfloat16* __restrict__ logits,
                            int E, int K) {
  extern __shared__ __align__(16) __nv_bfloat16 x_s[];
  __shared__ float ss[8][T];
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * 8 + warp;
  // The router's row is a weight no kernel of the step writes: its first chunks before the wait.
  const __nv_bfloat16* wr = W + (size_t)min(row, E - 1) * K;
  uint4 pre[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if ((lane + 32 * i) * 8 < K) pre[i] = *reinterpret_cast<const uint4*>(wr + (lane + 32 * i) * 8);
  pdl_wait();
  float part[T];
#pragma unroll
  for (int t = 0; t < T; ++t) part[t] = 0.f;
  for (int k = threadIdx.x; k < K; k += 256) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float v = __bfloat162float(res[(size_t)t * K + k]);
      if (add) v = __bfloat162float(__float2bfloat16(v + __bfloat162float(delta[(size_t)t * K + k])));
      x_s[t * K + k] = __float2bfloat16(v);
      part[t] += v * v;
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float v = warp_sum(part[t]);
    if (lane == 0) ss[warp][t] = v;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < K; k += 256) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float tot = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) tot += ss[i][t];
      const float inv = rsqrtf(tot / K + eps);
      const __nv_bfloat16 r = x_s[t * K + k];
      const __nv_bfloat16 x = __float2bfloat16(__bfloat162float(r) * inv * __bfloat162float(nw[k]));
      if (blockIdx.x == 0) {
        if (add) res_out[(size_t)t * K + k] = r;
        h[(size_t)t * K + k] = x;
      }
      x_s[t * K + k] = x;
    }
  }
  __syncthreads();
  if (row >= E) return;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.f;
  int i = 0;
  for (int c = lane; c * 8 < K; c += 32, ++i) {
    uint4 raw;
    if (i < 4) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (q == i) raw = pre[q];
    } else {
      raw = *reinterpret_cast<const uint4*>(wr + c * 8);
    }
    float wf[8];
    bf16x8_to_f32(raw, wf);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float xf[8];
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(x_s + t * K + c * 8), xf);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[t] = fmaf(wf[j], xf[j], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) logits[(size_t)t * E + row] = __float2bfloat16(v);
  }
}

#define MOE_NORM_ROUTER(T)                                                                      \
  extern "C" __global__ void __launch_bounds__(256) moe_norm_router_t##T(                       \
      const __nv_bfloat16* W, const __nv_bfloat16* res, const __nv_bfloat16* delta,             \
      __nv_bfloat16* res_out, const __nv_bfloat16* nw, float eps, int add, __nv_bfloat16* h,    \
      __nv_bfloat16* logits, int E, int K) {                                                    \
    norm_router<T>(W, res, delta, res_out, nw, eps, add, h, logits, E, K);                      \
  }
MOE_NORM_ROUTER(1)
MOE_NORM_ROUTER(2)
