// Device helpers of the LoRA kernels that read adapter rows a vector at a time
// (kernels/lora_silu.cu, kernels/lora_runs.cu; included, compiled into each fatbin).
#pragma once

#include "common.cuh"

namespace {

// Eight values of T from one (bf16) or two (f32) 16-byte loads.
template <typename T> struct Vec8;
template <> struct Vec8<__nv_bfloat16> {
  uint4 v;
  __device__ __forceinline__ void load(const __nv_bfloat16* p) {
    v = *reinterpret_cast<const uint4*>(p);
  }
  __device__ __forceinline__ void to(float* o) const { bf16x8_to_f32(v, o); }
};
template <> struct Vec8<float> {
  float4 a, b;
  __device__ __forceinline__ void load(const float* p) {
    a = reinterpret_cast<const float4*>(p)[0];
    b = reinterpret_cast<const float4*>(p)[1];
  }
  __device__ __forceinline__ void to(float* o) const {
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
    o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
  }
};

template <typename T> __device__ __forceinline__ float round_t(float x) {
  return to_f(from_f<T>(x));
}

// A row of r <= RMAX (a multiple of 8) values of b, all its loads issued at once.
template <typename T, int RMAX> struct RankRow {
  Vec8<T> v[RMAX / 8];
  __device__ __forceinline__ void load(const T* __restrict__ row, int r) {
#pragma unroll
    for (int c = 0; c < RMAX / 8; ++c)
      if (c * 8 < r) v[c].load(row + c * 8);
  }
  // sum_i ys[i] * row[i]
  __device__ __forceinline__ float dot(const float* ys, int r) const {
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < RMAX / 8; ++c) {
      if (c * 8 < r) {
        float bv[8];
        v[c].to(bv);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc += ys[c * 8 + i] * bv[i];
      }
    }
    return acc;
  }
};

}  // namespace
