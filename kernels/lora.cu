// LoRA deltas added to a fused matmul's output, per token through the adapter in its slot
// (src/engine/model/lora_slots.rs has the layout; launchers: src/engine/cuda/lora_ops.rs).
// Per layer and fused matmul of P projections: a = [slots, P * R, in], b = [slots, out, R];
// slot_of[t] >= slots means token t runs on the base weights and both kernels skip it.
#include <stdint.h>
#include "common.cuh"

// Shrink: y[t, j] = sum_k x[t, k] * a[slot_of[t], j, k] (f32), j < pr. Grid (ceil(pr / 8), T),
// 256 threads: warp w of block (bx, t) computes j = bx * 8 + w.
template <typename T>
__device__ __forceinline__ void lora_shrink(const T* __restrict__ x, const T* __restrict__ a,
                                            const uint32_t* __restrict__ slot_of,
                                            float* __restrict__ y, int in, int pr, int slots) {
  pdl_entry();
  const int t = blockIdx.y;
  const uint32_t s = slot_of[t];
  const int j = blockIdx.x * 8 + threadIdx.x / 32;
  if (s >= (uint32_t)slots || j >= pr) return;
  const int lane = threadIdx.x & 31;
  const T* xr = x + (size_t)t * in;
  const T* ar = a + ((size_t)s * pr + j) * in;
  float acc = 0.f;
  if constexpr (sizeof(T) == 2) {
    // Eight bf16 a load (in is a multiple of 8: the launcher checks).
    for (int k = lane * 8; k < in; k += 256) {
      float xv[8], av[8];
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(xr + k), xv);
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(ar + k), av);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc += xv[i] * av[i];
    }
  } else {
    for (int k = lane; k < in; k += 32) acc += to_f(xr[k]) * to_f(ar[k]);
  }
  acc = warp_sum(acc);
  if (lane == 0) y[(size_t)t * pr + j] = acc;
}

// Expand: out[t, o] += sum_r y[t, p * R + r] * b[slot_of[t], o, r], p = (o >= s1) + (o >= s2)
// the projection output row o belongs to. Grid (ceil(nout / 256), T), 256 threads, pr floats
// of shared memory.
template <typename T>
__device__ __forceinline__ void lora_expand(const float* __restrict__ y, const T* __restrict__ b,
                                            const uint32_t* __restrict__ slot_of,
                                            T* __restrict__ out, int nout, int r, int pr, int s1,
                                            int s2, int slots) {
  pdl_entry();
  extern __shared__ float ys[];
  const int t = blockIdx.y;
  const uint32_t s = slot_of[t];
  if (s >= (uint32_t)slots) return;  // uniform over the block
  for (int i = threadIdx.x; i < pr; i += blockDim.x) ys[i] = y[(size_t)t * pr + i];
  __syncthreads();
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= nout) return;
  const int p = (o >= s1) + (o >= s2);
  const T* br = b + ((size_t)s * nout + o) * r;
  const float* yp = ys + p * r;
  float acc = 0.f;
  for (int i = 0; i < r; ++i) acc += yp[i] * to_f(br[i]);
  T* dst = out + (size_t)t * nout + o;
  *dst = from_f<T>(to_f(*dst) + acc);
}

#define LORA_KERNELS(T, S)                                                                      \
  extern "C" __global__ void lora_shrink_##S(const T* x, const T* a, const uint32_t* slot_of,   \
                                             float* y, int in, int pr, int slots) {            \
    lora_shrink<T>(x, a, slot_of, y, in, pr, slots);                                            \
  }                                                                                             \
  extern "C" __global__ void lora_expand_##S(const float* y, const T* b,                       \
                                             const uint32_t* slot_of, T* out, int nout, int r, \
                                             int pr, int s1, int s2, int slots) {              \
    lora_expand<T>(y, b, slot_of, out, nout, r, pr, s1, s2, slots);                             \
  }

LORA_KERNELS(__nv_bfloat16, bf16)
LORA_KERNELS(float, f32)
