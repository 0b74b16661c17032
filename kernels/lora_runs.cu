// The LoRA shrink of steps of 17-64 rows on one-token tiles, by runs of the tile table
// (LaunchOptions::lora_runs; launcher: src/engine/cuda/lora_runs.rs). The table comes sorted
// by slot, so neighbouring tiles are mostly on one adapter: a block takes eight tiles, and its
// warps on one slot read the same rows of a, where the one-token shrink (kernels/lora.cu)
// takes a block per row of a and token and re-reads each row from L2 for every token. Each
// (token, row) is summed in one order of its own, whatever the table's order or the step's
// size. Adapter rows and the tile table are written by no kernel of a step: they are read
// before waiting on the kernel before (programmatic dependent launch, common.cuh).
#include <stdint.h>
#include "lora.cuh"

namespace {

constexpr uint32_t NONE = 0xffffffffu;

// Tile i's token and slot (NONE: past the table, padding, or a slot past those held).
__device__ __forceinline__ void tile_at(const uint32_t* __restrict__ tiles, int ntiles, int i,
                                        int slots, int& tok, uint32_t& slot) {
  tok = 0;
  slot = NONE;
  if (i < ntiles) {
    const uint32_t* tl = tiles + 3 * i;
    if (tl[1] != 0 && tl[2] < (uint32_t)slots) {
      tok = (int)tl[0];
      slot = tl[2];
    }
  }
}

}  // namespace

// Shrink: grid (ceil(pr / 2), ceil(ntiles / 8)), 256 threads. Warp w takes tile
// blockIdx.y * 8 + w (token t on slot s) and rows j0 = 2 * blockIdx.x, j0 + 1 of a[s]:
//   y[t, j] = warp_sum over lanes of (sum over the lane's chunks k = 8 * lane + 256 * q, q
//   ascending, of the chunk's eight products x[t, k + e] * a[s, j, k + e], e ascending).
// The block's warps on one slot read the same rows of a (close together in time, so L1 can
// serve all but the first); a lane has B chunks of a and of x in flight at once (the 1.7B's
// 2,048 inputs: one round of loads).
template <typename T>
__device__ void lora_shrink_runs(const T* __restrict__ x, const T* __restrict__ a,
                                 const uint32_t* __restrict__ tiles, int ntiles,
                                 float* __restrict__ y, int in, int pr, int slots) {
  constexpr int B = 8;
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j0 = 2 * blockIdx.x;
  int t;
  uint32_t s;
  tile_at(tiles, ntiles, blockIdx.y * 8 + warp, slots, t, s);
  if (s == NONE || j0 >= pr) return;  // uniform over the warp; no block barrier follows
  const bool two = j0 + 1 < pr;
  const T* a0 = a + ((size_t)s * pr + j0) * in;
  const T* a1 = two ? a0 + in : a0;  // without a second row, the first again (not written)
  Vec8<T> av0[B], av1[B];
  auto load_a = [&](int k0) {
#pragma unroll
    for (int q = 0; q < B; ++q) {
      const int k = k0 + 256 * q;
      if (k < in) {
        av0[q].load(a0 + k);
        av1[q].load(a1 + k);
      }
    }
  };
  load_a(8 * lane);
  pdl_wait();
  const T* xr = x + (size_t)t * in;
  float acc0 = 0.f, acc1 = 0.f;
  for (int k0 = 8 * lane; k0 < in; k0 += 256 * B) {
    if (k0 != 8 * lane) load_a(k0);
    Vec8<T> xv[B];
#pragma unroll
    for (int q = 0; q < B; ++q)
      if (k0 + 256 * q < in) xv[q].load(xr + k0 + 256 * q);
#pragma unroll
    for (int q = 0; q < B; ++q) {
      if (k0 + 256 * q < in) {
        float xf[8], af[8];
        xv[q].to(xf);
        av0[q].to(af);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc0 += xf[e] * af[e];
        av1[q].to(af);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc1 += xf[e] * af[e];
      }
    }
  }
  acc0 = warp_sum(acc0);
  acc1 = warp_sum(acc1);
  if (lane == 0) {
    y[(size_t)t * pr + j0] = acc0;
    if (two) y[(size_t)t * pr + j0 + 1] = acc1;
  }
}

#define LORA_RUNS(T, S)                                                                         \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      lora_shrink_runs_##S(const T* x, const T* a, const uint32_t* tiles, int ntiles, float* y, \
                           int in, int pr, int slots) {                                         \
    lora_shrink_runs<T>(x, a, tiles, ntiles, y, in, pr, slots);                                 \
  }

LORA_RUNS(__nv_bfloat16, bf16)
LORA_RUNS(float, f32)
