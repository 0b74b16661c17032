// One token's routing by one warp, for moe_route.cu (moe_route_one, moe_route): the picks
// (warp_argmax, redux_argmax, route_small) and the tables (one_token_tables). In an anonymous
// namespace, so each kernel file that includes it has its own.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "common.cuh"

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

}  // namespace
