// Shared by the attention kernels (decode.cu, fused_decode.cu, prefill.cu): the head-dim-128
// geometry (a half-warp per token, 8 dims a lane), vector loads, and the online-softmax
// helpers of the flash-decoding kernels. Each .cu includes it into its own anonymous
// namespace, so every kernel file compiles alone.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <mma.h>
#include <stddef.h>
#include <stdint.h>

#include "common.cuh"

namespace {

constexpr int HD = 128;
constexpr int LANES = 16;          // lanes per token
constexpr int PER = HD / LANES;    // dims per lane (8)
constexpr int THREADS = 128;
constexpr int GROUPS = THREADS / LANES;  // half-warps per block (8)

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* out) {
  bf16x8_to_f32(*reinterpret_cast<const uint4*>(p), out);
}

__device__ __forceinline__ void load8(const float* p, float* out) {
  float4 a = reinterpret_cast<const float4*>(p)[0];
  float4 b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

// Eight e4m3 (one 8-byte load) as f32, times s.
__device__ __forceinline__ void fp8x8_to_f32(uint2 raw, float s, float* out) {
  const __nv_fp8x2_storage_t* h = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(h[i], __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
    out[2 * i] = f.x * s;
    out[2 * i + 1] = f.y * s;
  }
}

__device__ __forceinline__ void load8(const fp8* p, float s, float* out) {
  fp8x8_to_f32(*reinterpret_cast<const uint2*>(p), s, out);
}
// A cache in the compute dtype has no scale.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float, float* out) {
  load8(p, out);
}

// One lane's 8 cache elements as loaded (16 bytes of bf16, 8 of e4m3), and as f32 (times s
// for e4m3; a bf16 cache has no scale).
template <typename KT>
struct KvRaw {
  using type = uint4;
};
template <>
struct KvRaw<fp8> {
  using type = uint2;
};
// f32 caches (f32 compute): 8 floats.
struct F32x8 {
  float4 a, b;
};
template <>
struct KvRaw<float> {
  using type = F32x8;
};
__device__ __forceinline__ void raw8_to_f32(uint4 r, float, float* out) { bf16x8_to_f32(r, out); }
__device__ __forceinline__ void raw8_to_f32(F32x8 r, float, float* out) {
  out[0] = r.a.x; out[1] = r.a.y; out[2] = r.a.z; out[3] = r.a.w;
  out[4] = r.b.x; out[5] = r.b.y; out[6] = r.b.z; out[7] = r.b.w;
}
__device__ __forceinline__ void raw8_to_f32(uint2 r, float s, float* out) {
  fp8x8_to_f32(r, s, out);
}

// Tokens per partition of a context of ctx tokens in `splits` partitions of at least part_min
// tokens (a multiple of 16); the decode kernel and its reduce agree on it.
__device__ __forceinline__ int decode_part(int ctx, int splits, int part_min) {
  return max(part_min, (((ctx + splits - 1) / splits) + 15) & ~15);
}

// sc[g] = q_g . k over the head: each lane's PER dims, summed over the half-warp's 16 lanes
// (every lane gets it; the whole warp must call it).
template <int G>
__device__ __forceinline__ void head_scores(const float (&qv)[G][PER], const float (&kv)[PER],
                                            float (&sc)[G]) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i) d += qv[g][i] * kv[i];
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o, LANES);
    sc[g] = d;
  }
}

// One token into each head's online softmax: max m, sum l, accumulator acc (value v).
template <int G>
__device__ __forceinline__ void softmax_step(const float (&sc)[G], const float (&v)[PER],
                                             float (&m)[G], float (&l)[G],
                                             float (&acc)[G][PER]) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float mn = fmaxf(m[g], sc[g]);
    float scale = __expf(m[g] - mn);
    float e = __expf(sc[g] - mn);
    l[g] = l[g] * scale + e;
#pragma unroll
    for (int i = 0; i < PER; ++i) acc[g][i] = acc[g][i] * scale + e * v[i];
    m[g] = mn;
  }
}

// A half-warp's state before its first token: running max -inf, sum and accumulators 0.
template <int G>
__device__ __forceinline__ void empty_groups(float (&m)[G], float (&l)[G], float (&acc)[G][PER]) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i) acc[g][i] = 0.f;
  }
}

// This half-warp's state (m, l per head; acc, PER dims a lane) into the shared arrays that
// merge_groups reads (the caller synchronizes the block after).
template <int G>
__device__ __forceinline__ void store_groups(const float (&m)[G], const float (&l)[G],
                                             const float (&acc)[G][PER], int grp, int lane,
                                             float (&sm)[GROUPS][G], float (&sl)[GROUPS][G],
                                             float (&sacc)[GROUPS][G][HD]) {
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) { sm[grp][g] = m[g]; sl[grp][g] = l[g]; }
  }
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int i = 0; i < PER; ++i) sacc[grp][g][lane * PER + i] = acc[g][i];
}

// The block's max M, sum L and accumulator A for head g, dim d, from the half-warps' states
// (sm/sl [GROUPS][G], sacc [GROUPS][G][HD] in shared memory).
template <int G>
__device__ __forceinline__ void merge_groups(const float (&sm)[GROUPS][G],
                                             const float (&sl)[GROUPS][G],
                                             const float (&sacc)[GROUPS][G][HD], int g, int d,
                                             float& M, float& L, float& A) {
  M = -INFINITY;
#pragma unroll
  for (int k = 0; k < GROUPS; ++k) M = fmaxf(M, sm[k][g]);
  L = 0.f;
  A = 0.f;
  if (M != -INFINITY) {
#pragma unroll
    for (int k = 0; k < GROUPS; ++k) {
      float w = __expf(sm[k][g] - M);
      L += sl[k][g] * w;
      A += sacc[k][g][d] * w;
    }
  }
}

}  // namespace

// The parameters of the decode kernels (paged_decode_g*, decode_fused_g*) and the prefill
// kernels (paged_prefill_g*, paged_prefill_tc_g*), passed by value as one struct each instead
// of 14-22 positional arguments. Each is mirrored by a `#[repr(C)]` struct of the same name
// in src/engine/cuda/attention.rs: pointers first (8 bytes each), then 64-bit, then 32-bit
// fields, so neither side pads between fields; the sizes are checked on both sides.
struct DecodeParams {
  const void* q;
  const void* k_cache;
  const void* v_cache;
  const uint32_t* block_tables;
  const uint32_t* ctx_lens;
  void* out;
  float* part_acc;
  float* part_ml;
  const uint32_t* width;  // the tables' row width on the device (graphs), or null: use W
  long long num_slots;
  int W;
  int block_size;
  int nkv;
  int part;
  float k_scale;  // fp8 caches: the layer's K and V scales (1 otherwise)
  float v_scale;
};
static_assert(sizeof(DecodeParams) == 104, "DecodeParams layout");
static_assert(offsetof(DecodeParams, width) == 64 && offsetof(DecodeParams, num_slots) == 72 &&
                  offsetof(DecodeParams, part) == 92 && offsetof(DecodeParams, v_scale) == 100,
              "DecodeParams layout");

struct FusedDecodeParams {
  const __nv_bfloat16* qkv;
  const __nv_bfloat16* q_w;
  const __nv_bfloat16* k_w;
  const float* inv_freq;
  const uint32_t* pos;
  const uint32_t* slots;
  void* k_cache;
  void* v_cache;
  const uint32_t* block_tables;
  const uint32_t* ctx_lens;
  __nv_bfloat16* out;
  float* part_acc;
  float* part_ml;
  uint32_t* counters;
  const uint32_t* width;
  long long num_slots;
  int W;
  int block_size;
  int nkv;
  int part;
  float k_scale;
  float v_scale;
  float eps;
  int stop;
  int kv_shift;  // log2 of the grid's KV heads per cache KV head (fused_decode.cu)
  int pad;
};
static_assert(sizeof(FusedDecodeParams) == 168, "FusedDecodeParams layout");
static_assert(offsetof(FusedDecodeParams, width) == 112 && offsetof(FusedDecodeParams, eps) == 152,
              "FusedDecodeParams layout");

struct PrefillParams {
  const void* q;
  const void* k_cache;
  const void* v_cache;
  const uint32_t* tiles;
  const uint32_t* seq_meta;
  const uint32_t* tables;
  void* out;
  long long num_slots;
  int block_size;
  int nkv;
  // Split-KV (the warpgroup-MMA flash kernel only; 1 elsewhere): each block takes 1/splits of
  // its tile's K/V tiles and writes unnormalized f32 outputs [splits][T][nh][128] and row
  // (max, sum) pairs [splits][T][nh][2], which flash_merge combines into `out`.
  float* part_o;
  float* part_ml;
  int splits;
  int rows;  // rows of q / out (T), for the partials' layout
  float k_scale;  // fp8 caches: the layer's K and V scales (1 otherwise)
  float v_scale;
  // fp8 caches: the chunks' own keys and values unrounded (bf16 [rows, nkv, 128], written by
  // the KV write), attended instead of their e4m3 copies; null: every key from the cache.
  const void* k_new;
  const void* v_new;
};
static_assert(sizeof(PrefillParams) == 120, "PrefillParams layout");
static_assert(offsetof(PrefillParams, num_slots) == 56 && offsetof(PrefillParams, nkv) == 68 &&
                  offsetof(PrefillParams, splits) == 88,
              "PrefillParams layout");
