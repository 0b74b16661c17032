// The KV write of the Qwen3 forward (its own family: everything that stores K/V into the
// paged cache outside the fused decode attention), for bf16 and f32 activations and fp8 caches:
//  * qk_norm_rope_kv_write: q/k RMSNorm, RoPE (rotate-half), q out, k/v into the paged cache
// It reads only device memory it is given, so a decode forward can be graph-captured.

#include <cuda_bf16.h>
#include <stdint.h>

#include "common.cuh"

namespace {

// One block per token, a warp per head (stepping by the block's warps): heads [0, nh) are the
// query heads, [nh, nh + nkv) the key heads (and copy the value head). Lane l holds elements l + 32*j of
// the head (head_dim = 32 * PER), so rotate-half pairs (i, i + hd/2) sit in one lane.
// q is written [T, nh, hd]; k and v go to slot slots[t] of the head-major caches
// [nkv, num_slots, hd]. cos/sin are computed in f32 from inv_freq [hd/2] and the position.
// KT: the caches' element type (T, or fp8: stored as x / scale, saturated; ks / vs the scales).
template <typename T, typename KT, int PER>
__device__ void qk_norm_rope_kv_write(const T* __restrict__ qkv, const T* __restrict__ q_w,
                                      const T* __restrict__ k_w, const float* __restrict__ inv_freq,
                                      const uint32_t* __restrict__ positions,
                                      const uint32_t* __restrict__ slots, T* __restrict__ q_out,
                                      KT* __restrict__ k_cache, KT* __restrict__ v_cache, int nh,
                                      int nkv, long long num_slots, float eps, float ks, float vs,
                                      T* __restrict__ k_new = nullptr,
                                      T* __restrict__ v_new = nullptr) {
  constexpr int HD = 32 * PER;
  const float kinv = 1.f / ks, vinv = 1.f / vs;
  int t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const T* row = qkv + (size_t)t * (nh + 2 * nkv) * HD;
  // Warps step through the heads (a block holds at most 32 warps).
  for (int head = threadIdx.x >> 5; head < nh + nkv; head += blockDim.x >> 5) {
    bool is_q = head < nh;
    const T* src = row + (size_t)head * HD;  // q heads, then k heads
    float o[PER];
    norm_rope_head<T, PER>(src, is_q ? q_w : k_w, inv_freq, (float)positions[t], eps, lane, o);
    if (is_q) {
      T* dst = q_out + ((size_t)t * nh + head) * HD;
#pragma unroll
      for (int j = 0; j < PER; ++j) dst[lane + 32 * j] = from_f<T>(o[j]);
    } else if (slots[t] != 0xffffffffu) {  // a padding row of a captured batch writes no KV
      int kh = head - nh;
      size_t off = ((size_t)kh * num_slots + slots[t]) * HD;
      const T* vsrc = row + (size_t)(nh + nkv + kh) * HD;
#pragma unroll
      for (int j = 0; j < PER; ++j) {
        k_cache[off + lane + 32 * j] = kv_store<KT>(o[j], kinv);
        v_cache[off + lane + 32 * j] = kv_store<KT>(to_f(vsrc[lane + 32 * j]), vinv);
      }
      // The unrounded rows a prefill over an fp8 cache attends to for the chunk's own keys.
      if (k_new != nullptr) {
        const size_t row = ((size_t)t * nkv + kh) * HD;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
          k_new[row + lane + 32 * j] = from_f<T>(o[j]);
          v_new[row + lane + 32 * j] = vsrc[lane + 32 * j];
        }
      }
    }
  }
}

}  // namespace

#define PS_KV_WRITE(T, NAME)                                                                    \
  extern "C" __global__ void qk_norm_rope_kv_write_hd128_##NAME(                                \
      const T* qkv, const T* q_w, const T* k_w, const float* inv_freq, const uint32_t* pos,     \
      const uint32_t* slots, T* q_out, T* k_cache, T* v_cache, int nh, int nkv,                 \
      long long num_slots, float eps) { pdl_entry();                                                         \
    qk_norm_rope_kv_write<T, T, 4>(qkv, q_w, k_w, inv_freq, pos, slots, q_out, k_cache, v_cache, \
                                   nh, nkv, num_slots, eps, 1.f, 1.f);                          \
  }

PS_KV_WRITE(__nv_bfloat16, bf16)
PS_KV_WRITE(float, f32)

// The KV write into fp8 caches (bf16 compute), with the layer's scales; with k_new / v_new
// (bf16 [T, nkv, 128], or null) also the rows unrounded, for the prefill of the chunk.
extern "C" __global__ void qk_norm_rope_kv_write_hd128_fp8(
    const __nv_bfloat16* qkv, const __nv_bfloat16* q_w, const __nv_bfloat16* k_w,
    const float* inv_freq, const uint32_t* pos, const uint32_t* slots, __nv_bfloat16* q_out,
    fp8* k_cache, fp8* v_cache, int nh, int nkv, long long num_slots, float eps, float ks,
    float vs, __nv_bfloat16* k_new, __nv_bfloat16* v_new) {
  pdl_entry();
  qk_norm_rope_kv_write<__nv_bfloat16, fp8, 4>(qkv, q_w, k_w, inv_freq, pos, slots, q_out, k_cache,
                                               v_cache, nh, nkv, num_slots, eps, ks, vs, k_new,
                                               v_new);
}
