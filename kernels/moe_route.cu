// The routing half of Qwen3-MoE's sparse layers on the device (launchers:
// src/engine/cuda/moe_ops.rs; the experts' half is in moe.cu and moe_mma.cu):
//
//  * moe_norm_router_t{1,2}: for decode steps of 1-2 tokens (LaunchOptions::moe_norm_router),
//                 the add+RMSNorm before the router and the router's matmul in one launch
//                 (otherwise the dense kernels' norm and linear give the logits [T, E]).
//  * moe_route:   per token, softmax (f32) and top-k (ties to the lower id), weights
//                 renormalized when asked and rounded to the compute dtype (as HF casts them);
//                 ids [T * k] u32, w [T * k] f32.
//  * moe_router_route: for one token over at most 128 experts (LaunchOptions::moe_router_route,
//                 bf16, sm_90), the router's matmul and moe_route_one's routing in one launch:
//                 a cluster of ceil(E / 8) blocks, the logits gathered in block 0's shared
//                 memory.
//  * moe_align:   one block (with the routing, `moe_route_align`, for up to 32 tokens): the
//                 pairs (token, slot) grouped by expert, `order` [P] (pair indices, grouped by
//                 expert), and tiles (start in order, count <= TM, expert) over each expert's
//                 run, the unused tail of the tile table zeroed.
//
// Launch shapes depend on T only, so decode steps are captured in CUDA graphs.
#include <cuda_bf16.h>
#include <stdint.h>

#include "cluster.cuh"
#include "common.cuh"
#include "gemv.cuh"

namespace {

// The warp's largest (best, best_id), ties to the lower id, in every lane.
__device__ __forceinline__ void warp_argmax(float& best, int& best_id) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
    if (ob > best || (ob == best && oi < best_id)) {
      best = ob;
      best_id = oi;
    }
  }
}

// The same pick by two warp reductions (redux.sync, sm_80+) instead of five shuffle rounds:
// the largest value as order-preserving bits (a float's bits with the sign bit set, or all
// bits flipped when negative), then the lowest id among the lanes that hold it. The same
// value and id as warp_argmax for every non-NaN input (LaunchOptions::moe_route_redux).
__device__ __forceinline__ void redux_argmax(float& best, int& best_id) {
  const uint32_t b = __float_as_uint(best);
  const uint32_t key = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  const uint32_t top = __reduce_max_sync(0xffffffffu, key);
  best_id = (int)__reduce_min_sync(0xffffffffu, key == top ? (uint32_t)best_id : 0xffffffffu);
  best = __uint_as_float((top & 0x80000000u) ? (top & 0x7fffffffu) : ~top);
}

// Routing of one token by one warp for up to 128 experts: lane l holds the probabilities of
// experts l, l + 32, l + 64, l + 96 in registers, read and exponentiated once (the same values
// the general path below recomputes at every pick); a pick marks its expert -2 (probabilities
// are >= 0, experts past e hold -1), lane s keeps pick s, writes it and returns its expert.
// REDUX: each pick by redux_argmax (the same picks).
template <typename T, bool REDUX = false>
__device__ __forceinline__ uint32_t route_small(const T* __restrict__ row,
                                                uint32_t* __restrict__ ids,
                                                float* __restrict__ w, int t, int e, int k,
                                                int norm, int lane) {
  float p[4];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    p[j] = lane + 32 * j < e ? to_f(row[lane + 32 * j]) : -INFINITY;
    m = fmaxf(m, p[j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float z = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    p[j] = lane + 32 * j < e ? expf(p[j] - m) : 0.f;
    z += p[j];
  }
  z = warp_sum(z);
#pragma unroll
  for (int j = 0; j < 4; ++j) p[j] = lane + 32 * j < e ? p[j] / z : -1.f;
  float mine_p = 0.f, sum = 0.f;
  uint32_t mine_id = 0;
  for (int s = 0; s < k; ++s) {
    float best = -1.f;
    int best_id = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (p[j] > best) {  // ascending ids within a lane: the first of equals stays
        best = p[j];
        best_id = lane + 32 * j;
      }
    }
    if constexpr (REDUX) redux_argmax(best, best_id);
    else warp_argmax(best, best_id);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (best_id == lane + 32 * j) p[j] = -2.f;
    if (lane == s) {
      mine_p = best;
      mine_id = (uint32_t)best_id;
    }
    sum += best;
  }
  if (lane < k) {
    ids[(size_t)t * k + lane] = mine_id;
    w[(size_t)t * k + lane] = to_f(from_f<T>(norm ? mine_p / sum : mine_p));
  }
  return mine_id;
}

// One warp per token.
template <typename T>
__device__ void moe_route(const T* __restrict__ logits, uint32_t* __restrict__ ids,
                          float* __restrict__ w, int tokens, int e, int k, int norm) {
  const int lane = threadIdx.x & 31;
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (t >= tokens) return;
  const T* row = logits + (size_t)t * e;
  if (e <= 128) {
    route_small<T>(row, ids, w, t, e, k, norm, lane);
    return;
  }
  float m = -INFINITY;
  for (int i = lane; i < e; i += 32) m = fmaxf(m, to_f(row[i]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float z = 0.f;
  for (int i = lane; i < e; i += 32) z += expf(to_f(row[i]) - m);
  z = warp_sum(z);
  // Lane l owns experts l, l + 32, ... (at most 32 of them: e <= 1024); bit j of `taken`
  // marks expert l + 32 j chosen.
  uint32_t taken = 0;
  float chosen_p[32];
  uint32_t chosen_id[32];
  float sum = 0.f;
  for (int s = 0; s < k; ++s) {
    float best = -1.f;
    int best_id = 0x7fffffff;
    for (int j = 0; lane + 32 * j < e; ++j) {
      if (taken & (1u << j)) continue;
      const float p = expf(to_f(row[lane + 32 * j]) - m) / z;
      if (p > best) {  // ascending ids within a lane: the first of equals stays
        best = p;
        best_id = lane + 32 * j;
      }
    }
    warp_argmax(best, best_id);
    if (best_id % 32 == lane) taken |= 1u << (best_id / 32);
    chosen_p[s] = best;
    chosen_id[s] = (uint32_t)best_id;
    sum += best;
  }
  if (lane == 0) {
    for (int s = 0; s < k; ++s) {
      const float v = norm ? chosen_p[s] / sum : chosen_p[s];
      ids[(size_t)t * k + s] = chosen_id[s];
      w[(size_t)t * k + s] = to_f(from_f<T>(v));
    }
  }
}

// Inclusive scans of a and b over the warp's lanes (lane l gets the sums of lanes 0..l).
__device__ __forceinline__ void warp_scan2(int& a, int& b, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int ya = __shfl_up_sync(0xffffffffu, a, o);
    const int yb = __shfl_up_sync(0xffffffffu, b, o);
    if (lane >= o) {
      a += ya;
      b += yb;
    }
  }
}

}  // namespace

// One block of 1024 threads, 2 * e ints of dynamic shared memory (e <= 1024): counts per
// expert, then one thread per expert scans the counts and its tile counts (warp shuffles, then
// the warps' totals) and writes its own tiles; then every pair takes its place.
__device__ __forceinline__ void align_pairs(const uint32_t* __restrict__ ids,
                                            uint32_t* __restrict__ order,
                                            uint32_t* __restrict__ tiles, int pairs, int e, int tm,
                                            int max_tiles) {
  extern __shared__ int sh[];
  int* counts = sh;
  int* cursor = sh + e;
  __shared__ int warp_pairs[32], warp_tiles[32];
  __shared__ int ntiles;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < e; i += blockDim.x) counts[i] = 0;
  __syncthreads();
  for (int p = tid; p < pairs; p += blockDim.x) atomicAdd(&counts[ids[p] % e], 1);
  __syncthreads();
  const int c = tid < e ? counts[tid] : 0;
  const int nt = (c + tm - 1) / tm;
  int sc = c, st = nt;  // inclusive scans within the warp
  warp_scan2(sc, st, lane);
  if (lane == 31) {
    warp_pairs[warp] = sc;
    warp_tiles[warp] = st;
  }
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    int vc = lane < nw ? warp_pairs[lane] : 0, vt = lane < nw ? warp_tiles[lane] : 0;
    warp_scan2(vc, vt, lane);
    warp_pairs[lane] = vc;  // inclusive over warps
    warp_tiles[lane] = vt;
  }
  __syncthreads();
  if (tid < e) {
    const int run = sc - c + (warp > 0 ? warp_pairs[warp - 1] : 0);
    int tile = st - nt + (warp > 0 ? warp_tiles[warp - 1] : 0);
    cursor[tid] = run;
    for (int s = 0; s < c && tile < max_tiles; s += tm, ++tile) {
      tiles[3 * tile] = run + s;
      tiles[3 * tile + 1] = min(tm, c - s);
      tiles[3 * tile + 2] = tid;
    }
  }
  if (tid == 0) ntiles = min(warp_tiles[((e + 31) >> 5) - 1], max_tiles);
  __syncthreads();
  for (int p = tid; p < pairs; p += blockDim.x) {
    const int pos = atomicAdd(&cursor[ids[p] % e], 1);
    order[pos] = p;
  }
  for (int i = ntiles + tid; i < max_tiles; i += blockDim.x) {
    tiles[3 * i] = 0;
    tiles[3 * i + 1] = 0;
    tiles[3 * i + 2] = 0;
  }
}

extern "C" __global__ void moe_align(const uint32_t* ids, uint32_t* order, uint32_t* tiles,
                                     int pairs, int e, int tm, int max_tiles) {
  pdl_entry();
  align_pairs(ids, order, tiles, pairs, e, tm, max_tiles);
}

// Small steps (tokens <= 32): the routing and the alignment in one block of 1024 threads (warp
// w routes token w), one launch fewer a layer.
#define MOE_ROUTE_ALIGN(T, S)                                                                   \
  extern "C" __global__ void moe_route_align_##S(const T* logits, uint32_t* ids, float* w,      \
                                                 uint32_t* order, uint32_t* tiles, int tokens,  \
                                                 int e, int k, int norm, int tm,                \
                                                 int max_tiles) {                               \
    pdl_entry();                                                                                \
    moe_route<T>(logits, ids, w, tokens, e, k, norm);                                           \
    __syncthreads();                                                                            \
    align_pairs(ids, order, tiles, tokens * k, e, tm, max_tiles);                               \
  }
MOE_ROUTE_ALIGN(__nv_bfloat16, bf16)
MOE_ROUTE_ALIGN(float, f32)

// One token's tables from its k picks (lane s < k holds pick s's expert `mine`), what
// moe_route_align writes for it: the picks are distinct experts, so each is a run (and a tile)
// of one pair, in ascending expert order; pick s goes to position rank(s), the number of picks
// with a lower expert; tiles past k are zeroed.
__device__ __forceinline__ void one_token_tables(uint32_t mine, int k, uint32_t* order,
                                                 uint32_t* tiles, int max_tiles, int lane) {
  int rank = 0;
  for (int s = 0; s < k; ++s) rank += __shfl_sync(0xffffffffu, mine, s) < mine ? 1 : 0;
  if (lane < k) order[rank] = (uint32_t)lane;
  if (lane < k && rank < max_tiles) {
    tiles[3 * rank] = (uint32_t)rank;
    tiles[3 * rank + 1] = 1u;
    tiles[3 * rank + 2] = mine;
  }
  for (int i = k + lane; i < max_tiles; i += 32) {
    tiles[3 * i] = 0u;
    tiles[3 * i + 1] = 0u;
    tiles[3 * i + 2] = 0u;
  }
}

// One token over at most 128 experts (LaunchOptions::moe_route_one): the routing and the
// alignment by one warp (one_token_tables). NAME_rx: the picks by redux_argmax
// (LaunchOptions::moe_route_redux).
#define MOE_ROUTE_ONE(T, NAME, RX)                                                              \
  extern "C" __global__ void NAME(const T* logits, uint32_t* ids, float* w, uint32_t* order,    \
                                  uint32_t* tiles, int e, int k, int norm, int max_tiles) {     \
    pdl_entry();                                                                                \
    const int lane = threadIdx.x & 31;                                                          \
    const uint32_t mine = route_small<T, RX>(logits, ids, w, 0, e, k, norm, lane);              \
    one_token_tables(mine, k, order, tiles, max_tiles, lane);                                   \
  }
MOE_ROUTE_ONE(__nv_bfloat16, moe_route_one_bf16, false)
MOE_ROUTE_ONE(float, moe_route_one_f32, false)
MOE_ROUTE_ONE(__nv_bfloat16, moe_route_one_rx_bf16, true)
MOE_ROUTE_ONE(float, moe_route_one_rx_f32, true)

#define MOE_ROUTE(T, S)                                                                         \
  extern "C" __global__ void moe_route_##S(const T* logits, uint32_t* ids, float* w, int tokens, \
                                           int e, int k, int norm) {                            \
    pdl_entry();                                                                                \
    moe_route<T>(logits, ids, w, tokens, e, k, norm);                                           \
  }
MOE_ROUTE(__nv_bfloat16, bf16)
MOE_ROUTE(float, f32)

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
