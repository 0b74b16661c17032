// The routing half of Qwen3-MoE's sparse layers on the device (launchers:
// src/engine/cuda/moe_ops.rs; the router's matmul with the norm in one launch is in
// moe_router.cu, the experts' half in moe.cu and moe_mma.cu):
//
//  * moe_route:   per token, softmax (f32) and top-k (ties to the lower id), weights
//                 renormalized when asked and rounded to the compute dtype (as HF casts them);
//                 ids [T * k] u32, w [T * k] f32.
//  * moe_align:   one block (with the routing, `moe_route_align`, for up to 32 tokens): the
//                 pairs (token, slot) grouped by expert, `order` [P] (pair indices, grouped by
//                 expert), and tiles (start in order, count <= TM, expert) over each expert's
//                 run, the unused tail of the tile table zeroed.
//
// Launch shapes depend on T only, so decode steps are captured in CUDA graphs.
#include <cuda_bf16.h>
#include <stdint.h>

#include "common.cuh"

namespace {

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
