// One token's routing by one warp for up to 128 experts (moe_route.cu, and the gate|up kernel
// with the routing folded in, moe.cu): included after common.cuh, in each file's anonymous
// namespace.
#pragma once

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

// Routing of one token by one warp for up to 128 experts: lane l holds the probabilities of
// experts l, l + 32, l + 64, l + 96 in registers, read and exponentiated once (the same values
// the general path below recomputes at every pick); a pick marks its expert -2 (probabilities
// are >= 0, experts past e hold -1), lane s keeps pick s, writes it (with `write`) and returns
// its expert.
template <typename T>
__device__ __forceinline__ uint32_t route_small(const T* __restrict__ row,
                                                uint32_t* __restrict__ ids,
                                                float* __restrict__ w, int t, int e, int k,
                                                int norm, int lane, bool write) {
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
    warp_argmax(best, best_id);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (best_id == lane + 32 * j) p[j] = -2.f;
    if (lane == s) {
      mine_p = best;
      mine_id = (uint32_t)best_id;
    }
    sum += best;
  }
  if (write && lane < k) {
    ids[(size_t)t * k + lane] = mine_id;
    w[(size_t)t * k + lane] = to_f(from_f<T>(norm ? mine_p / sum : mine_p));
  }
  return mine_id;
}

// The position of this lane's pick (lane < k; `mine` its expert) among the token's k picks in
// ascending expert order, returned; with `write`, the alignment moe_route_one writes for one
// token: pick s at position rank(s) of `order`, a one-pair tile (rank, 1, expert) each, the
// table's tail past k zeroed. The k experts are distinct, so the ranks are too.
__device__ __forceinline__ int route_one_tables(uint32_t mine, uint32_t* __restrict__ order,
                                                uint32_t* __restrict__ tiles, int k,
                                                int max_tiles, int lane, bool write) {
  int rank = 0;
  for (int s = 0; s < k; ++s) rank += __shfl_sync(0xffffffffu, mine, s) < mine ? 1 : 0;
  if (!write) return rank;
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
  return rank;
}

}  // namespace
