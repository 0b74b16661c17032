// The sparse MLP of Qwen3-MoE on the device, the experts' half (launchers:
// src/engine/cuda/moe_ops.rs; the candle-op reference: src/engine/model/moe.rs). The routing
// (the router's norm and matmul, softmax, top-k, the pairs grouped into tiles) is in
// moe_route.cu; then, per tile of pairs of one expert:
//
//  * moe_gate_up: per tile and 8 rows of the expert's gate and up, act = silu(gate) * up for
//                 the tile's pairs (rows of the expert read once per tile); bf16 tiles of 16
//                 or 64 pairs on tensor cores are in moe_mma.cu.
//  * moe_down:    per tile and 8 rows of the expert's down, y[pair] = down · act, times the
//                 pair's weight, rounded as HF rounds it.
//  * moe_sum:     out[t] = the token's pairs' y summed in ascending expert order (a thread
//                 per output column).
//
// Nothing reads the host: the launch shapes depend on T only (the tile table has room for the
// worst case), so decode steps are captured in CUDA graphs. Experts outside this rank's range
// (expert parallelism) are skipped and add nothing.
#include <cuda_bf16.h>
#include <stdint.h>

#include "common.cuh"
#include "moe.cuh"


namespace {

// A weight chunk of the experts' matmuls: LD 0 a plain load (cached in L1); 1 evict-first in
// L1 and L2 (ld.global.cs: on the H200 the one-pair gate|up 1-2% faster a step on the 30B-A3B
// shape, #29). Cached in L2 only at L2's normal priority (ld.global.cg) it measured as slow as
// the plain loads (round 49), so the gain is L2's eviction priority. The down + sum's loads
// with ld.global.cs need more than its 128 registers (88 bytes spilled; measured 2-6% slower);
// evict-first in L2 by a cache policy with its act rows read as they are summed, it does not
// spill but measured 3-14% slower (round 49).
template <int LD>
__device__ __forceinline__ uint4 ld_weight(const uint4* p) {
  if constexpr (LD == 1) return __ldcs(p);
  return *p;
}

// Dot products of R weight rows (bf16: eight values a load, four loads of each row in flight
// before their FMAs) with the tile's x rows; acc[r][c] for row r and the tile's pair c.
// `rows[c]` points at pair c's input row. (Eight loads in flight, a 2,048-wide row in one
// round: no faster on the H200, 34.6 against 34.8 us for a token's experts, slower at 8 tokens.)
// LD: how the weights are loaded (the same values, so the same sums; see ld_weight).
template <typename T, int TM, int R, int LD = 0>
__device__ __forceinline__ void tile_dot(const T* const* wr, const T* const* rows, int n, int len,
                                         int lane, float (*acc)[TM]) {
  if constexpr (sizeof(T) == 2) {
    constexpr int U = 4;
    for (int k0 = lane * 8; k0 < len; k0 += 32 * 8 * U) {
      uint4 wv[R][U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = k0 + u * 256;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (k < len) {
            const uint4* src = reinterpret_cast<const uint4*>(wr[r] + k);
            wv[r][u] = ld_weight<LD>(src);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = k0 + u * 256;
        if (k >= len) break;
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) bf16x8_to_f32(wv[r][u], wf[r]);
#pragma unroll
        for (int c = 0; c < TM; ++c) {
          if (c < n) {
            float xv[8];
            bf16x8_to_f32(*reinterpret_cast<const uint4*>(rows[c] + k), xv);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int i = 0; i < 8; ++i) acc[r][c] += xv[i] * wf[r][i];
          }
        }
      }
    }
  } else {
    for (int k = lane; k < len; k += 32) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float wv = to_f(wr[r][k]);
#pragma unroll
        for (int c = 0; c < TM; ++c)
          if (c < n) acc[r][c] += to_f(rows[c][k]) * wv;
      }
    }
  }
}

// Grid (ceil(inter / 8), tiles), 256 threads: warp w of block (bx, tile) takes row j = bx * 8
// + w of the tile's expert's gate and of its up, for every pair of the tile. gate_up: [E_local,
// 2 * inter, hidden]; act: [P, inter] by position in `order`.
// LD: how the weight rows are loaded (ld_weight; LaunchOptions::moe_gate_up_cs).
template <typename T, int TM, int LD = 0>
__device__ void moe_gate_up(const T* __restrict__ x, const T* __restrict__ gate_up,
                            const uint32_t* __restrict__ order, const uint32_t* __restrict__ tiles,
                            T* __restrict__ act, int hidden, int inter, int k, int first,
                            int local) {
  pdl_entry();
  const MoeTile tl = moe_tile_of(tiles, first, local);
  const int start = tl.start, n = tl.n, ex = tl.ex;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int j = blockIdx.x * 8 + warp;
  if (!tl.live || j >= inter) return;
  const T* rows[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) rows[c] = x + (size_t)(order[start + min(c, n - 1)] / k) * hidden;
  const T* g = gate_up + ((size_t)ex * 2 * inter + j) * hidden;
  const T* wr[2] = {g, g + (size_t)inter * hidden};
  float acc[2][TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) acc[0][c] = acc[1][c] = 0.f;
  tile_dot<T, TM, 2, LD>(wr, rows, n, hidden, lane, acc);
#pragma unroll
  for (int c = 0; c < TM; ++c) {
    if (c < n) {
      // As the dense path: gate and up rounded to T, then silu(gate) * up in f32.
      const float gv = to_f(from_f<T>(warp_sum(acc[0][c])));
      const float uv = to_f(from_f<T>(warp_sum(acc[1][c])));
      if (lane == 0) act[(size_t)(start + c) * inter + j] = from_f<T>(gv / (1.f + __expf(-gv)) * uv);
    }
  }
}

// Grid (ceil(hidden / (8 R)), tiles), 256 threads: warp w of block (bx, tile) takes rows o =
// (bx * 8 + w) * R .. + R of the tile's expert's down ([E_local, hidden, inter]) for every pair
// of the tile (R 4 for one-pair tiles: a down row of 768 inputs is three loads a lane, four rows
// a warp keep twelve in flight; on the H200 8.1 against 8.9 us for one token, 62 against 78 for
// eight); y: [P, hidden] by pair index, the expert's output rounded to T, times the pair's
// weight, rounded again (HF: bf16 output times bf16 weight).
template <typename T, int TM, int R = 1>
__device__ void moe_down(const T* __restrict__ act, const T* __restrict__ down,
                         const uint32_t* __restrict__ order, const uint32_t* __restrict__ tiles,
                         const float* __restrict__ w, T* __restrict__ y, int hidden, int inter,
                         int first, int local) {
  pdl_entry();
  const MoeTile tl = moe_tile_of(tiles, first, local);
  const int start = tl.start, n = tl.n, ex = tl.ex;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int o0 = (blockIdx.x * 8 + warp) * R;
  if (!tl.live || o0 >= hidden) return;
  const T* rows[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) rows[c] = act + (size_t)(start + min(c, n - 1)) * inter;
  const T* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = down + ((size_t)ex * hidden + min(o0 + r, hidden - 1)) * inter;
  float acc[R][TM];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < TM; ++c) acc[r][c] = 0.f;
  tile_dot<T, TM, R>(wr, rows, n, inter, lane, acc);
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int c = 0; c < TM; ++c) {
      if (c < n) {
        const float v = to_f(from_f<T>(warp_sum(acc[r][c])));
        if (lane == 0 && o0 + r < hidden) {
          const uint32_t pair = order[start + c];
          y[(size_t)pair * hidden + o0 + r] = from_f<T>(v * w[pair]);
        }
      }
    }
  }
}

// Token t's pairs on this rank's experts (first..first + local) in ascending expert order, the
// order HF adds them in: sid[s] the expert of the token's slot s, slot_order[0..n) the slots;
// returns n. The whole block calls it (at most 32 slots).
// RANK (LaunchOptions::moe_rank_sort): warp 0 finds the same order in parallel instead of
// thread 0's insertion sort (k dependent rounds of shared-memory loads, ~1 us at k = 8): lane
// s holds slot s's expert and counts the live slots before it in (expert, slot) order, the
// order a stable sort gives, which the insertion sort is; one barrier instead of two.
template <bool RANK = false>
__device__ __forceinline__ int token_experts(const uint32_t* __restrict__ ids, int t, int k,
                                             int first, int local, uint32_t* sid,
                                             int* slot_order) {
  __shared__ int live;
  if constexpr (RANK) {
    if (threadIdx.x < 32) {
      const int s = threadIdx.x;
      const uint32_t me = s < k ? ids[(size_t)t * k + s] : 0xffffffffu;
      const bool on = s < k && (int)me - first >= 0 && (int)me - first < local;
      const unsigned lives = __ballot_sync(0xffffffffu, on);
      int rank = 0;
      for (int j = 0; j < k; ++j) {
        const uint32_t other = __shfl_sync(0xffffffffu, me, j);
        if (((lives >> j) & 1u) && (other < me || (other == me && j < s))) ++rank;
      }
      if (s < k) sid[s] = me;
      if (on) slot_order[rank] = s;
      if (s == 0) live = __popc(lives);
    }
    __syncthreads();
    return live;
  }
  if (threadIdx.x < k) sid[threadIdx.x] = ids[(size_t)t * k + threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) {
    int n = 0;
    for (int s = 0; s < k; ++s) {
      const int ex = (int)sid[s] - first;
      if (ex < 0 || ex >= local) continue;
      int at = n++;
      while (at > 0 && sid[slot_order[at - 1]] > sid[s]) {
        slot_order[at] = slot_order[at - 1];
        --at;
      }
      slot_order[at] = s;
    }
    live = n;
  }
  __syncthreads();
  return live;
}

// Grid (tokens, ceil(hidden / 256)), 256 threads: out[t] = sum of the token's pairs' y in
// ascending expert order, each add rounded to T (HF's index_add in the compute dtype); pairs on
// other ranks' experts add nothing. Thread c of block (t, bx) takes column bx * 256 + c and
// issues its pairs' loads eight at a time before the ordered adds.
template <typename T>
__device__ void moe_sum(const T* __restrict__ y, const uint32_t* __restrict__ ids,
                        T* __restrict__ out, int hidden, int k, int first, int local) {
  pdl_entry();
  const int t = blockIdx.x;
  __shared__ uint32_t sid[32];
  __shared__ int slot_order[32];
  const int n = token_experts(ids, t, k, first, local, sid, slot_order);
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= hidden) return;
  const T* yt = y + (size_t)t * k * hidden + c;
  float acc = 0.f;
  for (int i0 = 0; i0 < n; i0 += 8) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = i0 + i < n ? to_f(yt[(size_t)slot_order[i0 + i] * hidden]) : 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i0 + i < n) acc = to_f(from_f<T>(acc + v[i]));
  }
  out[(size_t)t * hidden + c] = from_f<T>(acc);
}

// Down and sum in one launch for one-pair tiles (LaunchOptions::moe_down_sum, bf16): grid
// (ceil(hidden / 8), tokens), 256 threads; warp w of block (bx, t) takes output row o = bx * 8
// + w of token t and runs through its pairs on this rank's experts in ascending expert order,
// four experts' loads in flight at a time: each expert's dot product summed as moe_down's
// (a lane's values in ascending k, then warp_sum), rounded to T, times the pair's weight,
// rounded, and added to the row's sum rounded as moe_sum adds. So out holds moe_down then
// moe_sum's bits without y's round trip or the second launch. act rows are found by the pair's
// position in `order` (at most 32 pairs a token). (Its weights loaded evict-first spilled and
// measured 2-6% slower on the H200 at batches 1-8: ld_weight.)
template <typename T, bool RANK = false>
__device__ void moe_down_sum(const T* __restrict__ act, const T* __restrict__ down,
                             const uint32_t* __restrict__ ids, const uint32_t* __restrict__ order,
                             const float* __restrict__ w, T* __restrict__ out, int hidden,
                             int inter, int k, int first, int local) {
  pdl_entry();
  const int t = blockIdx.y;
  __shared__ uint32_t sid[32];
  __shared__ int pos[32];
  __shared__ int slot_order[32];
  const int pairs = gridDim.y * k;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const uint32_t p = order[i];
    if ((int)(p / k) == t) pos[p % k] = i;
  }
  const int n = token_experts<RANK>(ids, t, k, first, local, sid, slot_order);  // syncs the block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int o = blockIdx.x * 8 + warp;
  if (o >= hidden) return;
  constexpr int E = 4, U = 3;  // experts, and chunks of 256 inputs, in flight
  float sum = 0.f;
  for (int e0 = 0; e0 < n; e0 += E) {
    const T* wr[E];
    const T* ar[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int s = slot_order[min(e0 + e, n - 1)];
      wr[e] = down + ((size_t)((int)sid[s] - first) * hidden + o) * inter;
      ar[e] = act + (size_t)pos[s] * inter;
    }
    float acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.f;
    for (int k0 = lane * 8; k0 < inter; k0 += 256 * U) {
      uint4 wv[E][U], av[E][U];
#pragma unroll
      for (int e = 0; e < E; ++e)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int kk = k0 + u * 256;
          if (e0 + e < n && kk < inter) {
            wv[e][u] = *reinterpret_cast<const uint4*>(wr[e] + kk);
            av[e][u] = *reinterpret_cast<const uint4*>(ar[e] + kk);
          }
        }
#pragma unroll
      for (int e = 0; e < E; ++e)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (e0 + e < n && k0 + u * 256 < inter) {
            float wf[8], xf[8];
            bf16x8_to_f32(wv[e][u], wf);
            bf16x8_to_f32(av[e][u], xf);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[e] += xf[i] * wf[i];
          }
        }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float v = to_f(from_f<T>(warp_sum(acc[e])));
      if (e0 + e < n) {
        const uint32_t pair = (uint32_t)(t * k + slot_order[e0 + e]);
        const float y = to_f(from_f<T>(v * w[pair]));
        sum = to_f(from_f<T>(sum + y));
      }
    }
  }
  if (lane == 0) out[(size_t)t * hidden + o] = from_f<T>(sum);
}

}  // namespace

// Two blocks an SM (registers capped at 128): the 256 blocks of a 2,048-wide token in one wave.
extern "C" __global__ void __launch_bounds__(256, 2)
    moe_down_sum_bf16(const __nv_bfloat16* act, const __nv_bfloat16* down, const uint32_t* ids,
                      const uint32_t* order, const float* w, __nv_bfloat16* out, int hidden,
                      int inter, int k, int first, int local) {
  moe_down_sum<__nv_bfloat16>(act, down, ids, order, w, out, hidden, inter, k, first, local);
}

// The same with the tokens' expert order ranked by one warp (LaunchOptions::moe_rank_sort).
extern "C" __global__ void __launch_bounds__(256, 2)
    moe_down_sum_rk_bf16(const __nv_bfloat16* act, const __nv_bfloat16* down, const uint32_t* ids,
                         const uint32_t* order, const float* w, __nv_bfloat16* out, int hidden,
                         int inter, int k, int first, int local) {
  moe_down_sum<__nv_bfloat16, true>(act, down, ids, order, w, out, hidden, inter, k, first,
                                    local);
}

#define MOE_KERNELS(T, S)                                                                       \
  extern "C" __global__ void moe_sum_##S(const T* y, const uint32_t* ids, T* out, int hidden,   \
                                         int k, int first, int local) {                         \
    moe_sum<T>(y, ids, out, hidden, k, first, local);                                           \
  }
#define MOE_TILE_KERNELS(T, S, TM)                                                              \
  extern "C" __global__ void moe_gate_up_t##TM##_##S(const T* x, const T* gate_up,              \
                                                     const uint32_t* order,                     \
                                                     const uint32_t* tiles, T* act, int hidden, \
                                                     int inter, int k, int first, int local) {  \
    moe_gate_up<T, TM>(x, gate_up, order, tiles, act, hidden, inter, k, first, local);          \
  }                                                                                             \
  extern "C" __global__ void moe_down_t##TM##_##S(const T* act, const T* down,                  \
                                                  const uint32_t* order, const uint32_t* tiles, \
                                                  const float* w, T* y, int hidden, int inter,  \
                                                  int first, int local) {                       \
    moe_down<T, TM>(act, down, order, tiles, w, y, hidden, inter, first, local);                \
  }

MOE_KERNELS(__nv_bfloat16, bf16)
MOE_KERNELS(float, f32)
MOE_TILE_KERNELS(__nv_bfloat16, bf16, 8)
MOE_TILE_KERNELS(float, f32, 8)
MOE_TILE_KERNELS(float, f32, 32)

// One-pair tiles (steps of up to 64 pairs, LaunchOptions::moe_tile_one): gate|up a row pair a
// warp, down four rows a warp.
// LD (ld_weight): 0 plain loads; moe_gate_up_t1_cs_bf16 evict-first (LaunchOptions::
// moe_gate_up_cs).
#define MOE_GATE_UP_T1(NAME, LD)                                                                \
  extern "C" __global__ void NAME(const __nv_bfloat16* x, const __nv_bfloat16* gate_up,         \
                                  const uint32_t* order, const uint32_t* tiles,                 \
                                  __nv_bfloat16* act, int hidden, int inter, int k, int first,  \
                                  int local) {                                                  \
    moe_gate_up<__nv_bfloat16, 1, LD>(x, gate_up, order, tiles, act, hidden, inter, k, first,   \
                                      local);                                                   \
  }
MOE_GATE_UP_T1(moe_gate_up_t1_bf16, 0)
MOE_GATE_UP_T1(moe_gate_up_t1_cs_bf16, 1)
extern "C" __global__ void moe_down_t1_bf16(const __nv_bfloat16* act, const __nv_bfloat16* down,
                                            const uint32_t* order, const uint32_t* tiles,
                                            const float* w, __nv_bfloat16* y, int hidden, int inter,
                                            int first, int local) {
  moe_down<__nv_bfloat16, 1, 4>(act, down, order, tiles, w, y, hidden, inter, first, local);
}

