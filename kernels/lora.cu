// LoRA deltas added to a fused matmul's output (src/engine/model/lora_slots.rs has the
// layout; launchers: src/engine/cuda/lora_ops.rs). Per layer and fused matmul of P
// projections: a = [slots, P * R, in], b = [slots, out, R]. The tokens on adapters come as
// tiles: (first token, count <= TM, slot), tokens of a tile consecutive and on one slot, so
// each block reads its rows of a and b once for up to tm tokens. A tile with count 0 (the
// unused tail of a graph's table) or a slot >= slots does nothing.
#include <stdint.h>
#include "common.cuh"

// Shrink: y[t, j] = sum_k x[t, k] * a[slot, j, k] (f32) for the tokens t of a tile, j < pr.
// Tiles of one token (TM 1): grid (pr, tiles), 256 threads: the block splits row j of a over
// its threads (eight values a thread a step, so a row of 1-6k inputs takes each thread 1-3
// independent loads; small steps are latency-bound) and the warps' sums meet in shared
// memory. Wider tiles (TM 8): grid (ceil(pr / 8), tiles), warp w of block (bx, tile) takes
// row j = bx * 8 + w for every token of the tile, so the tile's rows of x are read by 8 warps
// and not by a block per row of a (large batches are bound by those reads).
template <typename T, int TM>
__device__ __forceinline__ void lora_shrink(const T* __restrict__ x, const T* __restrict__ a,
                                            const uint32_t* __restrict__ tiles,
                                            float* __restrict__ y, int in, int pr, int slots) {
  pdl_entry();
  __shared__ float part[8][TM];
  const uint32_t* tl = tiles + 3 * blockIdx.y;
  const int t0 = tl[0], n = tl[1];
  const uint32_t s = tl[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int j = TM == 1 ? blockIdx.x : blockIdx.x * 8 + warp;
  if (n == 0 || s >= (uint32_t)slots) return;  // uniform over the block
  if (TM != 1 && j >= pr) return;              // uniform over the warp; no block barrier follows
  const T* ar = a + ((size_t)s * pr + j) * in;
  // TM 1: the block's threads stride the row; TM 8: the warp's lanes do.
  const int first = TM == 1 ? threadIdx.x : lane;
  const int stride = TM == 1 ? 256 : 32;
  float acc[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) acc[c] = 0.f;
  if constexpr (sizeof(T) == 2) {
    // Eight bf16 a load (in is a multiple of 8: the launcher checks).
    for (int k = first * 8; k < in; k += stride * 8) {
      float av[8];
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(ar + k), av);
#pragma unroll
      for (int c = 0; c < TM; ++c) {
        if (c < n) {
          float xv[8];
          bf16x8_to_f32(*reinterpret_cast<const uint4*>(x + (size_t)(t0 + c) * in + k), xv);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[c] += xv[i] * av[i];
        }
      }
    }
  } else {
    for (int k = first; k < in; k += stride) {
      const float av = to_f(ar[k]);
#pragma unroll
      for (int c = 0; c < TM; ++c)
        if (c < n) acc[c] += to_f(x[(size_t)(t0 + c) * in + k]) * av;
    }
  }
  if constexpr (TM == 1) {
    const float v = warp_sum(acc[0]);
    if (lane == 0) part[warp][0] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) sum += part[w][0];
      y[(size_t)t0 * pr + j] = sum;
    }
  } else {
#pragma unroll
    for (int c = 0; c < TM; ++c) {
      if (c < n) {
        const float v = warp_sum(acc[c]);
        if (lane == 0) y[(size_t)(t0 + c) * pr + j] = v;
      }
    }
  }
}

// Expand: out[t, o] += sum_r y[t, p * R + r] * b[slot, o, r] for the tokens t of a tile, p =
// (o >= s1) + (o >= s2) the projection output row o belongs to. Grid (ceil(nout / 256),
// tiles), 256 threads, TM * pr floats of shared memory. R is a multiple of 8 (the slots pad
// it): a thread reads its row of b eight values a load.
template <typename T, int TM>
__device__ __forceinline__ void lora_expand(const float* __restrict__ y, const T* __restrict__ b,
                                            const uint32_t* __restrict__ tiles,
                                            T* __restrict__ out, int nout, int r, int pr, int s1,
                                            int s2, int slots) {
  pdl_entry();
  extern __shared__ float ys[];
  const uint32_t* tl = tiles + 3 * blockIdx.y;
  const int t0 = tl[0], n = tl[1];
  const uint32_t s = tl[2];
  if (n == 0 || s >= (uint32_t)slots) return;  // uniform over the block
  for (int i = threadIdx.x; i < n * pr; i += blockDim.x) ys[i] = y[(size_t)t0 * pr + i];
  __syncthreads();
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= nout) return;
  const int p = (o >= s1) + (o >= s2);
  const T* br = b + ((size_t)s * nout + o) * r;
  float acc[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) acc[c] = 0.f;
  for (int i0 = 0; i0 < r; i0 += 8) {
    float bv[8];
    if constexpr (sizeof(T) == 2) {
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(br + i0), bv);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) bv[i] = to_f(br[i0 + i]);
    }
#pragma unroll
    for (int c = 0; c < TM; ++c) {
      if (c < n) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[c] += ys[c * pr + p * r + i0 + i] * bv[i];
      }
    }
  }
#pragma unroll
  for (int c = 0; c < TM; ++c) {
    if (c < n) {
      T* dst = out + (size_t)(t0 + c) * nout + o;
      *dst = from_f<T>(to_f(*dst) + acc[c]);
    }
  }
}

#define LORA_KERNELS(T, S, TM)                                                                  \
  extern "C" __global__ void lora_shrink_t##TM##_##S(const T* x, const T* a,                    \
                                                    const uint32_t* tiles, float* y, int in,    \
                                                    int pr, int slots) {                        \
    lora_shrink<T, TM>(x, a, tiles, y, in, pr, slots);                                          \
  }                                                                                             \
  extern "C" __global__ void lora_expand_t##TM##_##S(const float* y, const T* b,                \
                                                    const uint32_t* tiles, T* out, int nout,    \
                                                    int r, int pr, int s1, int s2, int slots) { \
    lora_expand<T, TM>(y, b, tiles, out, nout, r, pr, s1, s2, slots);                           \
  }

// Tiles of one token (small decode steps: one warp per row of a, latency-bound) and of up to
// eight (large batches and prefill: each block reads its adapter rows once per tile).
LORA_KERNELS(__nv_bfloat16, bf16, 1)
LORA_KERNELS(__nv_bfloat16, bf16, 8)
LORA_KERNELS(float, f32, 1)
LORA_KERNELS(float, f32, 8)
