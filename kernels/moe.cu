// The sparse MLP of Qwen3-MoE on the device (launchers: src/engine/cuda/moe_ops.rs; the
// candle-op reference: src/engine/model/moe.rs). Per sparse layer, after the router's matmul
// (the dense kernels' norm + linear) gives logits [T, E]:
//
//  * moe_route:   per token, softmax (f32) and top-k (ties to the lower id), weights
//                 renormalized when asked and rounded to the compute dtype (as HF casts them);
//                 ids [T * k] u32, w [T * k] f32.
//  * moe_align:   one block: the pairs (token, slot) grouped by expert, `order` [P] (pair
//                 indices, grouped by expert), and tiles (start in order, count <= TM, expert)
//                 over each expert's run, the unused tail of the tile table zeroed.
//  * moe_gate_up: per tile and 8 rows of the expert's gate and up, act = silu(gate) * up for
//                 the tile's pairs (rows of the expert read once per tile).
//  * moe_down:    per tile and 8 rows of the expert's down, y[pair] = down · act, times the
//                 pair's weight, rounded as HF rounds it.
//  * moe_sum:     out[t] = the token's pairs' y summed in ascending expert order.
//
// Nothing reads the host: the launch shapes depend on T only (the tile table has room for the
// worst case), so decode steps are captured in CUDA graphs. Experts outside this rank's range
// (expert parallelism) are skipped and add nothing.
#include <cuda_bf16.h>
#include <stdint.h>

#include "common.cuh"

namespace {

// One warp per token.
template <typename T>
__device__ void moe_route(const T* __restrict__ logits, uint32_t* __restrict__ ids,
                          float* __restrict__ w, int tokens, int e, int k, int norm) {
  const int lane = threadIdx.x & 31;
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (t >= tokens) return;
  const T* row = logits + (size_t)t * e;
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
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (ob > best || (ob == best && oi < best_id)) {
        best = ob;
        best_id = oi;
      }
    }
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

}  // namespace

// One block of 1024 threads, 2 * e ints of dynamic shared memory.
extern "C" __global__ void moe_align(const uint32_t* __restrict__ ids, uint32_t* __restrict__ order,
                                     uint32_t* __restrict__ tiles, int pairs, int e, int tm,
                                     int max_tiles) {
  pdl_entry();
  extern __shared__ int sh[];
  int* counts = sh;
  int* cursor = sh + e;
  __shared__ int ntiles;
  for (int i = threadIdx.x; i < e; i += blockDim.x) counts[i] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&counts[ids[p] % e], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0, tile = 0;
    for (int x = 0; x < e; ++x) {
      cursor[x] = run;
      for (int s = 0; s < counts[x] && tile < max_tiles; s += tm, ++tile) {
        tiles[3 * tile] = run + s;
        tiles[3 * tile + 1] = min(tm, counts[x] - s);
        tiles[3 * tile + 2] = x;
      }
      run += counts[x];
    }
    ntiles = tile;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int pos = atomicAdd(&cursor[ids[p] % e], 1);
    order[pos] = p;
  }
  for (int i = ntiles + threadIdx.x; i < max_tiles; i += blockDim.x) {
    tiles[3 * i] = 0;
    tiles[3 * i + 1] = 0;
    tiles[3 * i + 2] = 0;
  }
}

namespace {

// Dot products of one weight row (bf16: eight a load) with the tile's x rows; acc[c] for the
// tile's pair c. `rows[c]` points at pair c's input row.
template <typename T, int TM>
__device__ __forceinline__ void tile_dot(const T* __restrict__ wr, const T* const* rows, int n,
                                         int len, int lane, float* acc) {
  if constexpr (sizeof(T) == 2) {
    for (int k = lane * 8; k < len; k += 32 * 8) {
      float wv[8];
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(wr + k), wv);
#pragma unroll
      for (int c = 0; c < TM; ++c) {
        if (c < n) {
          float xv[8];
          bf16x8_to_f32(*reinterpret_cast<const uint4*>(rows[c] + k), xv);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[c] += xv[i] * wv[i];
        }
      }
    }
  } else {
    for (int k = lane; k < len; k += 32) {
      const float wv = to_f(wr[k]);
#pragma unroll
      for (int c = 0; c < TM; ++c)
        if (c < n) acc[c] += to_f(rows[c][k]) * wv;
    }
  }
}

// Grid (ceil(inter / 8), tiles), 256 threads: warp w of block (bx, tile) takes row j = bx * 8
// + w of the tile's expert's gate and of its up, for every pair of the tile. gate_up: [E_local,
// 2 * inter, hidden]; act: [P, inter] by position in `order`.
template <typename T, int TM>
__device__ void moe_gate_up(const T* __restrict__ x, const T* __restrict__ gate_up,
                            const uint32_t* __restrict__ order, const uint32_t* __restrict__ tiles,
                            T* __restrict__ act, int hidden, int inter, int k, int first,
                            int local) {
  pdl_entry();
  const uint32_t* tl = tiles + 3 * blockIdx.y;
  const int start = tl[0], n = tl[1];
  const int ex = (int)tl[2] - first;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int j = blockIdx.x * 8 + warp;
  if (n == 0 || ex < 0 || ex >= local || j >= inter) return;
  const T* rows[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) rows[c] = x + (size_t)(order[start + min(c, n - 1)] / k) * hidden;
  const T* g = gate_up + ((size_t)ex * 2 * inter + j) * hidden;
  const T* u = g + (size_t)inter * hidden;
  float ag[TM], au[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) ag[c] = au[c] = 0.f;
  tile_dot<T, TM>(g, rows, n, hidden, lane, ag);
  tile_dot<T, TM>(u, rows, n, hidden, lane, au);
#pragma unroll
  for (int c = 0; c < TM; ++c) {
    if (c < n) {
      // As the dense path: gate and up rounded to T, then silu(gate) * up in f32.
      const float gv = to_f(from_f<T>(warp_sum(ag[c])));
      const float uv = to_f(from_f<T>(warp_sum(au[c])));
      if (lane == 0) act[(size_t)(start + c) * inter + j] = from_f<T>(gv / (1.f + __expf(-gv)) * uv);
    }
  }
}

// Grid (ceil(hidden / 8), tiles), 256 threads: warp w of block (bx, tile) takes row o = bx * 8
// + w of the tile's expert's down ([E_local, hidden, inter]) for every pair of the tile; y:
// [P, hidden] by pair index, the expert's output rounded to T, times the pair's weight,
// rounded again (HF: bf16 output times bf16 weight).
template <typename T, int TM>
__device__ void moe_down(const T* __restrict__ act, const T* __restrict__ down,
                         const uint32_t* __restrict__ order, const uint32_t* __restrict__ tiles,
                         const float* __restrict__ w, T* __restrict__ y, int hidden, int inter,
                         int first, int local) {
  pdl_entry();
  const uint32_t* tl = tiles + 3 * blockIdx.y;
  const int start = tl[0], n = tl[1];
  const int ex = (int)tl[2] - first;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int o = blockIdx.x * 8 + warp;
  if (n == 0 || ex < 0 || ex >= local || o >= hidden) return;
  const T* rows[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) rows[c] = act + (size_t)(start + min(c, n - 1)) * inter;
  const T* dr = down + ((size_t)ex * hidden + o) * inter;
  float acc[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) acc[c] = 0.f;
  tile_dot<T, TM>(dr, rows, n, inter, lane, acc);
#pragma unroll
  for (int c = 0; c < TM; ++c) {
    if (c < n) {
      const float v = to_f(from_f<T>(warp_sum(acc[c])));
      if (lane == 0) {
        const uint32_t pair = order[start + c];
        y[(size_t)pair * hidden + o] = from_f<T>(v * w[pair]);
      }
    }
  }
}

// Grid (tokens), 256 threads: out[t] = sum of the token's pairs' y in ascending expert order,
// each add rounded to T (HF's index_add in the compute dtype); pairs on other ranks' experts
// add nothing.
template <typename T>
__device__ void moe_sum(const T* __restrict__ y, const uint32_t* __restrict__ ids,
                        T* __restrict__ out, int hidden, int k, int first, int local) {
  pdl_entry();
  const int t = blockIdx.x;
  __shared__ int slot_order[32];
  if (threadIdx.x == 0) {
    int n = 0;
    for (int s = 0; s < k; ++s) {
      const int ex = (int)ids[(size_t)t * k + s] - first;
      if (ex < 0 || ex >= local) continue;
      int at = n++;
      while (at > 0 && ids[(size_t)t * k + slot_order[at - 1]] > ids[(size_t)t * k + s]) {
        slot_order[at] = slot_order[at - 1];
        --at;
      }
      slot_order[at] = s;
    }
    for (int s = n; s < 32; ++s) slot_order[s] = -1;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float acc = 0.f;
    for (int i = 0; i < k && slot_order[i] >= 0; ++i)
      acc = to_f(from_f<T>(acc + to_f(y[((size_t)t * k + slot_order[i]) * hidden + c])));
    out[(size_t)t * hidden + c] = from_f<T>(acc);
  }
}

}  // namespace

#define MOE_KERNELS(T, S)                                                                       \
  extern "C" __global__ void moe_route_##S(const T* logits, uint32_t* ids, float* w, int tokens, \
                                           int e, int k, int norm) {                            \
    pdl_entry();                                                                                \
    moe_route<T>(logits, ids, w, tokens, e, k, norm);                                           \
  }                                                                                             \
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
MOE_TILE_KERNELS(__nv_bfloat16, bf16, 32)
MOE_TILE_KERNELS(float, f32, 8)
MOE_TILE_KERNELS(float, f32, 32)
