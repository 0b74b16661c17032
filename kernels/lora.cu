// LoRA deltas added to a fused matmul's output (src/engine/model/lora_slots.rs has the
// layout; launchers: src/engine/cuda/lora_ops.rs). Per layer and fused matmul of P
// projections: a = [slots, P * R, in], b = [slots, out, R]. The tokens on adapters come as
// tiles: (first token, count <= TM, slot), tokens of a tile consecutive and on one slot, so
// each block reads its rows of a and b once for up to tm tokens. A tile with count 0 (the
// unused tail of a graph's table) or a slot >= slots does nothing. The tile table and the
// adapter rows are written by no kernel of a step, so both kernels read them before waiting on
// the kernel before them (programmatic dependent launch, common.cuh).
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
  constexpr bool BLOCK_ROW = TM == 1;  // a block per row of a
  // The tile table (uploaded before the step) and the adapter rows (uploaded when an adapter
  // takes its slot) are written by no kernel of the step: the block reads its tile and its
  // first chunks of a before waiting on the kernel before it (common.cuh), so their latency
  // overlaps that kernel; x is read after the wait.
  pdl_trigger();
  __shared__ float part[8][TM];
  const uint32_t* tl = tiles + 3 * blockIdx.y;
  const int t0 = tl[0], n = tl[1];
  const uint32_t s = tl[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int j = BLOCK_ROW ? blockIdx.x : blockIdx.x * 8 + warp;
  if (n == 0 || s >= (uint32_t)slots) return;  // uniform over the block
  if (!BLOCK_ROW && j >= pr) return;           // uniform over the warp; no block barrier follows
  const T* ar = a + ((size_t)s * pr + j) * in;
  // A block per row: the block's threads stride the row; a warp per row: its lanes do.
  const int first = BLOCK_ROW ? threadIdx.x : lane;
  const int stride = BLOCK_ROW ? 256 : 32;
  float acc[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) acc[c] = 0.f;
  if constexpr (sizeof(T) == 2) {
    // Eight bf16 a load (in is a multiple of 8: the launcher checks); the first PRE loads of
    // the row before the wait.
    constexpr int PRE = 4;
    uint4 pre[PRE];
#pragma unroll
    for (int i = 0; i < PRE; ++i) {
      const int k = (first + i * stride) * 8;
      if (k < in) pre[i] = *reinterpret_cast<const uint4*>(ar + k);
    }
    pdl_wait();
    int i = 0;
    for (int k = first * 8; k < in; k += stride * 8, ++i) {
      float av[8];
      const uint4 raw = i < PRE ? reg_pick(pre, i) : *reinterpret_cast<const uint4*>(ar + k);
      bf16x8_to_f32(raw, av);
#pragma unroll
      for (int c = 0; c < TM; ++c) {
        if (c < n) {
          float xv[8];
          bf16x8_to_f32(*reinterpret_cast<const uint4*>(x + (size_t)(t0 + c) * in + k), xv);
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[c] += xv[q] * av[q];
        }
      }
    }
  } else {
    pdl_wait();
    for (int k = first; k < in; k += stride) {
      const float av = to_f(ar[k]);
#pragma unroll
      for (int c = 0; c < TM; ++c)
        if (c < n) acc[c] += to_f(x[(size_t)(t0 + c) * in + k]) * av;
    }
  }
  if constexpr (BLOCK_ROW) {
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
  // As the shrink: the tile and the first chunks of this thread's row of b before the wait;
  // y and out after it.
  pdl_trigger();
  extern __shared__ float ys[];
  const uint32_t* tl = tiles + 3 * blockIdx.y;
  const int t0 = tl[0], n = tl[1];
  const uint32_t s = tl[2];
  if (n == 0 || s >= (uint32_t)slots) return;  // uniform over the block
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  const T* br = b + ((size_t)s * nout + min(o, nout - 1)) * r;
  constexpr int PRE = 4;  // ranks up to 32 (bf16) come whole before the wait
  uint4 pre[PRE];
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int i = 0; i < PRE; ++i)
      if (o < nout && i * 8 < r) pre[i] = *reinterpret_cast<const uint4*>(br + i * 8);
  }
  pdl_wait();
  for (int i = threadIdx.x; i < n * pr; i += blockDim.x) ys[i] = y[(size_t)t0 * pr + i];
  __syncthreads();
  if (o >= nout) return;
  const int p = (o >= s1) + (o >= s2);
  float acc[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) acc[c] = 0.f;
  for (int i0 = 0; i0 < r; i0 += 8) {
    float bv[8];
    if constexpr (sizeof(T) == 2) {
      const uint4 raw =
          i0 < PRE * 8 ? reg_pick(pre, i0 / 8) : *reinterpret_cast<const uint4*>(br + i0);
      bf16x8_to_f32(raw, bv);
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

