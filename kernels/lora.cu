// LoRA deltas added to a fused matmul's output (src/engine/model/lora_slots.rs has the
// layout; launchers: src/engine/cuda/lora_ops.rs). Per layer and fused matmul of P
// projections: a = [slots, P * R, in], b = [slots, out, R]. The tokens on adapters come as
// tiles: (first token, count <= tm, slot), tokens of a tile consecutive and on one slot, so
// each block reads its rows of a and b once for up to tm tokens. A tile with count 0 (the
// unused tail of a graph's table) or a slot >= slots does nothing.
#include <stdint.h>
#include "common.cuh"

// Shrink: y[t, j] = sum_k x[t, k] * a[slot, j, k] (f32) for the tokens t of a tile, j < pr.
// Grid (ceil(pr / 8), tiles), 256 threads: warp w of block (bx, tile) computes j = bx * 8 + w
// for every token of the tile, reading a's row j once.
template <typename T>
__device__ __forceinline__ void lora_shrink(const T* __restrict__ x, const T* __restrict__ a,
                                            const uint32_t* __restrict__ tiles,
                                            float* __restrict__ y, int in, int pr, int slots) {
  pdl_entry();
  const uint32_t* tl = tiles + 3 * blockIdx.y;
  const int t0 = tl[0], n = tl[1];
  const uint32_t s = tl[2];
  const int j = blockIdx.x * 8 + threadIdx.x / 32;
  if (n == 0 || s >= (uint32_t)slots || j >= pr) return;
  const int lane = threadIdx.x & 31;
  const T* ar = a + ((size_t)s * pr + j) * in;
  float acc[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) acc[c] = 0.f;
  if constexpr (sizeof(T) == 2) {
    // Eight bf16 a load (in is a multiple of 8: the launcher checks).
    for (int k = lane * 8; k < in; k += 256) {
      float av[8];
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(ar + k), av);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        if (c < n) {
          float xv[8];
          bf16x8_to_f32(*reinterpret_cast<const uint4*>(x + (size_t)(t0 + c) * in + k), xv);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[c] += xv[i] * av[i];
        }
      }
    }
  } else {
    for (int k = lane; k < in; k += 32) {
      const float av = to_f(ar[k]);
#pragma unroll
      for (int c = 0; c < 8; ++c)
        if (c < n) acc[c] += to_f(x[(size_t)(t0 + c) * in + k]) * av;
    }
  }
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    if (c < n) {
      const float v = warp_sum(acc[c]);
      if (lane == 0) y[(size_t)(t0 + c) * pr + j] = v;
    }
  }
}

// Expand: out[t, o] += sum_r y[t, p * R + r] * b[slot, o, r] for the tokens t of a tile, p =
// (o >= s1) + (o >= s2) the projection output row o belongs to. Grid (ceil(nout / 256),
// tiles), 256 threads, n * pr floats of shared memory (n <= tm of the launch).
template <typename T>
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
  float acc[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) acc[c] = 0.f;
  for (int i = 0; i < r; ++i) {
    const float bv = to_f(br[i]);
#pragma unroll
    for (int c = 0; c < 8; ++c)
      if (c < n) acc[c] += ys[c * pr + p * r + i] * bv;
  }
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    if (c < n) {
      T* dst = out + (size_t)(t0 + c) * nout + o;
      *dst = from_f<T>(to_f(*dst) + acc[c]);
    }
  }
}

#define LORA_KERNELS(T, S)                                                                      \
  extern "C" __global__ void lora_shrink_##S(const T* x, const T* a, const uint32_t* tiles,     \
                                             float* y, int in, int pr, int slots) {            \
    lora_shrink<T>(x, a, tiles, y, in, pr, slots);                                              \
  }                                                                                             \
  extern "C" __global__ void lora_expand_##S(const float* y, const T* b, const uint32_t* tiles, \
                                             T* out, int nout, int r, int pr, int s1, int s2,  \
                                             int slots) {                                       \
    lora_expand<T>(y, b, tiles, out, nout, r, pr, s1, s2, slots);                               \
  }

LORA_KERNELS(__nv_bfloat16, bf16)
LORA_KERNELS(float, f32)
