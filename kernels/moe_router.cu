// A sparse layer's router on the device (launchers: src/engine/cuda/moe_router.rs), each an
// alternative to the dense kernels' add+RMSNorm and linear in front of moe_route.cu's routing:
//  * moe_norm_router_t{1,2}: for decode steps of 1-2 tokens (LaunchOptions::moe_norm_router),
//                 the add+RMSNorm before the router and the router's matmul in one launch.
//  * moe_router_route, moe_norm_router_route: for one token over at most 128 experts
//                 (LaunchOptions::moe_router_route, moe_norm_router_route; bf16, sm_90), the
//                 router's matmul (behind the add+RMSNorm) and moe_route_one's routing in one
//                 launch: a cluster of ceil(E / 8) blocks, the logits gathered in block 0's
//                 shared memory.
#include <cuda_bf16.h>
#include <stdint.h>

#include "cluster.cuh"
#include "common.cuh"
#include "gemv.cuh"
#include "moe_route.cuh"

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

// add_rmsnorm's (layer_ops.cu) row for one token, bit for bit, by a block of 256 threads into
// shared memory `hs` (K bf16; block 0 also writes `res_out` when `add` and the normed row to
// `h`): add_rmsnorm runs a block of VB = clamp(K, 32, 1024) threads (rounded up to a warp)
// whose thread t sums the squares of elements t, t + VB, ... in that order; thread r here plays
// its threads r, r + 256, r + 512 and r + 768 (virtual warp w + 8 j of real warp w), so each
// warp_sum and then block_sum's sum over the virtual warps add the same terms in the same
// order, and each normed element is rounded from the same values.
__device__ void norm_row(const __nv_bfloat16* res, const __nv_bfloat16* __restrict__ delta,
                         __nv_bfloat16* res_out, const __nv_bfloat16* __restrict__ nw, float eps,
                         int add, __nv_bfloat16* __restrict__ h, int K, __nv_bfloat16* hs) {
  __shared__ float part[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int VB = min(1024, max(32, (K + 31) / 32 * 32));
  const bool writer = blockIdx.z == 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int vt = threadIdx.x + 256 * j;
    if (vt >= VB) break;  // uniform in a warp: VB is a multiple of 32
    float ss = 0.f;
    for (int i = vt; i < K; i += VB) {
      float v = to_f(res[i]);
      if (add) {
        const __nv_bfloat16 sum = from_f<__nv_bfloat16>(v + to_f(delta[i]));
        if (writer) res_out[i] = sum;
        hs[i] = sum;
        v = to_f(sum);
      } else {
        hs[i] = res[i];
      }
      ss += v * v;
    }
    ss = warp_sum(ss);
    if (lane == 0) part[warp + 8 * j] = ss;
  }
  __syncthreads();
  if (warp == 0) {
    float s = lane < VB / 32 ? part[lane] : 0.f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const float inv = rsqrtf(total / K + eps);
  for (int i = threadIdx.x; i < K; i += 256) {
    const __nv_bfloat16 x = from_f<__nv_bfloat16>(to_f(hs[i]) * inv * to_f(nw[i]));
    hs[i] = x;
    if (writer) h[i] = x;
  }
  __syncthreads();
}

// The router's matmul and one token's routing in one launch (LaunchOptions::moe_router_route;
// bf16, one token, E <= 128, sm_90). Grid (1, 1, ceil(E / 8)) as one cluster (one block
// without), 256 threads: warp w of block z computes logit z * 8 + w as the skinny matmul
// gemv_t1_bf16 does (its first batch of weight loads before the wait, dot_rows, rounded to
// bf16: the same bits), writes it to `logits` and into block 0's shared memory; behind a
// cluster barrier warp 0 of block 0 routes the token from there as moe_route_one does
// (route_small, one_token_tables): the same ids, weights and tables, one launch and one trip
// of the logits through memory fewer. RX: the picks by redux_argmax
// (LaunchOptions::moe_route_redux).
// NORM (LaunchOptions::moe_norm_router_route): h is first the add+RMSNorm of (res, delta) by
// every block (norm_row: add_rmsnorm's bits; block 0 writes the sum and h), from which the
// warps' dot products read: the norm's launch, too, is folded in.
template <bool RX, bool NORM>
__device__ void router_route(const __nv_bfloat16* __restrict__ W, const __nv_bfloat16* h,
                             __nv_bfloat16* __restrict__ logits, uint32_t* ids, float* w,
                             uint32_t* order, uint32_t* tiles, int E, int K, int k, int norm,
                             int max_tiles, const __nv_bfloat16* res,
                             const __nv_bfloat16* delta, __nv_bfloat16* res_out,
                             const __nv_bfloat16* nw, float eps, int add) {
  __shared__ __nv_bfloat16 lg[128];
  extern __shared__ __align__(16) __nv_bfloat16 hs[];  // NORM: the normed row (K)
  pdl_trigger();
  // One block (E <= 8) is launched without a cluster: its own barrier then.
  const bool cl = gridDim.z > 1;
  // Every block has started before any writes block 0's shared memory (waited for below).
  if (cl) cluster_arrive();
  const int lane = threadIdx.x % 32;
  int rows[1];
  rows[0] = blockIdx.z * WARPS + threadIdx.x / 32;
  const bool ok = rows[0] < E;
  if (!ok) rows[0] = 0;
  uint4 wb[1][BATCH];
  if (ok) load_batch<1>(W, rows, K, lane, wb);
  pdl_wait();
  if constexpr (NORM) {
    norm_row(res, delta, res_out, nw, eps, add, const_cast<__nv_bfloat16*>(h), K, hs);
    h = hs;
  }
  __nv_bfloat16 v = __float2bfloat16(0.f);
  if (ok) {
    float acc[1][1];
    dot_rows<1, 1>(W, PlainX{h, K}, rows, K, lane, wb, acc);
    v = __float2bfloat16(acc[0][0]);
  }
  if (cl) cluster_wait();
  if (ok && lane == 0) {
    logits[rows[0]] = v;
    *cluster_peer(&lg[rows[0]], 0) = v;
  }
  // Release: the logits in block 0's shared memory before it reads them.
  if (!cl) {
    __syncthreads();
  } else {
    cluster_arrive();
    if (blockIdx.z != 0) return;
    cluster_wait();
  }
  if (threadIdx.x >= 32) return;
  const uint32_t mine = route_small<__nv_bfloat16, RX>(lg, ids, w, 0, E, k, norm, lane);
  one_token_tables(mine, k, order, tiles, max_tiles, lane);
}

#define MOE_ROUTER_ROUTE(NAME, RX)                                                              \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      NAME(const __nv_bfloat16* W, const __nv_bfloat16* h, __nv_bfloat16* logits,               \
           uint32_t* ids, float* w, uint32_t* order, uint32_t* tiles, int E, int K, int k,      \
           int norm, int max_tiles) {                                                           \
    router_route<RX, false>(W, h, logits, ids, w, order, tiles, E, K, k, norm, max_tiles,       \
                            nullptr, nullptr, nullptr, nullptr, 0.f, 0);                        \
  }
MOE_ROUTER_ROUTE(moe_router_route_bf16, false)
MOE_ROUTER_ROUTE(moe_router_route_rx_bf16, true)

// The same behind the add+RMSNorm (LaunchOptions::moe_norm_router_route): h is written (block
// 0), K bf16 of dynamic shared memory.
#define MOE_NORM_ROUTER_ROUTE(NAME, RX)                                                         \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      NAME(const __nv_bfloat16* W, __nv_bfloat16* h, __nv_bfloat16* logits, uint32_t* ids,      \
           float* w, uint32_t* order, uint32_t* tiles, int E, int K, int k, int norm,           \
           int max_tiles, const __nv_bfloat16* res, const __nv_bfloat16* delta,                 \
           __nv_bfloat16* res_out, const __nv_bfloat16* nw, float eps, int add) {               \
    router_route<RX, true>(W, h, logits, ids, w, order, tiles, E, K, k, norm, max_tiles, res,   \
                           delta, res_out, nw, eps, add);                                       \
  }
MOE_NORM_ROUTER_ROUTE(moe_norm_router_route_bf16, false)
MOE_NORM_ROUTER_ROUTE(moe_norm_router_route_rx_bf16, true)
