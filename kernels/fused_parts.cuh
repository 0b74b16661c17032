// Parts of the fused decode attention (`fused_decode.cu`, its only includer): the merge of
// partials through global memory, the cluster merge's weights, and the q/k norm and RoPE of
// two heads a warp. Each .cu includes its headers into its own anonymous namespace, as
// attention.cuh says.
#pragma once

#include "decode_mma.cuh"

namespace {

constexpr int MERGE_STAGE = 32;    // partials a global merge stages in shared memory

// The last of `nparts` partials (index 0 .. nparts-1 of the `splits` slots of heads
// hb .. hb+G-1, hb = b * nh + kh * G) to be written merges them into out (rows hb ..): each
// writer calls this after writing its partial; the counter goes back to zero.
template <int G>
__device__ void merge_global(const float* part_acc, const float* part_ml, uint32_t* counter,
                             int nparts, size_t hb, int splits, __nv_bfloat16* __restrict__ out) {
  __shared__ bool merge;
  __threadfence();  // this block's partial is visible before the counter says so
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t done = atomicAdd(counter, 1u) + 1;
    merge = done == (uint32_t)nparts;
    if (merge) *counter = 0;  // every partial counted: ready for the next launch
  }
  __syncthreads();
  if (!merge) return;
  __threadfence();
  // Every max and sum first into shared memory (one round of loads), then each output's
  // accumulators (another): the same sums in the same order as a loop over the partials.
  __shared__ float sM[G][MERGE_STAGE], sL[G][MERGE_STAGE];
  const bool staged = nparts <= MERGE_STAGE;
  if (staged) {
    for (int i = threadIdx.x; i < G * nparts; i += THREADS) {
      const int g = i / nparts, s = i % nparts;
      const size_t pi = (hb + g) * splits + s;
      sM[g][s] = __ldcg(&part_ml[pi * 2]);
      sL[g][s] = __ldcg(&part_ml[pi * 2 + 1]);
    }
    __syncthreads();
  }
  for (int idx = threadIdx.x; idx < G * HD; idx += THREADS) {
    const int g = idx / HD, d = idx % HD;
    const size_t base = (hb + g) * splits;
    float M = -INFINITY, L = 0.f, A = 0.f;
    if (staged) {
      float a[MERGE_STAGE];
#pragma unroll
      for (int s = 0; s < MERGE_STAGE; ++s)
        if (s < nparts) a[s] = __ldcg(&part_acc[(base + s) * HD + d]);
#pragma unroll
      for (int s = 0; s < MERGE_STAGE; ++s)
        if (s < nparts) M = fmaxf(M, sM[g][s]);
      if (M != -INFINITY) {
#pragma unroll
        for (int s = 0; s < MERGE_STAGE; ++s)
          if (s < nparts) {
            const float w = __expf(sM[g][s] - M);
            L += sL[g][s] * w;
            A += a[s] * w;
          }
      }
    } else {
      for (int s = 0; s < nparts; ++s) M = fmaxf(M, __ldcg(&part_ml[(base + s) * 2]));
      if (M != -INFINITY) {
        for (int s = 0; s < nparts; ++s) {
          const float w = __expf(__ldcg(&part_ml[(base + s) * 2]) - M);
          L += __ldcg(&part_ml[(base + s) * 2 + 1]) * w;
          A += __ldcg(&part_acc[(base + s) * HD + d]) * w;
        }
      }
    }
    out[(hb + g) * HD + d] = (__nv_bfloat16)(L > 0.f ? A / L : 0.f);
  }
}

// The cluster merge's weights, by the first warp: lane g * CP + r the weight e^(M_r - M) of
// partial r of head g into wR, and each head's max M and sum L (by one lane, in partition
// order: the sums of a loop over the partials) into mG / lG. Inlined by the fused attention for
// groups 1-4; merge_weights below is the same called (group 8).
template <int G, int CP>
__device__ __forceinline__ void merge_weights_body(const float (&pM)[CP][G],
                                                   const float (&pL)[CP][G], int cused,
                                                   float (&wR)[CP][G], float (&mG)[G],
                                                   float (&lG)[G]) {
  const int g = threadIdx.x / CP, r = threadIdx.x % CP;
  const bool mine = g < G && r < cused;
  float M = mine ? pM[r][g] : -INFINITY;
#pragma unroll
  for (int o = CP / 2; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o, CP));
  if (mine) wR[r][g] = M != -INFINITY ? __expf(pM[r][g] - M) : 0.f;
  __syncwarp();
  if (g < G && r == 0) {
    float L = 0.f;
    if (M != -INFINITY)
      for (int k = 0; k < cused; ++k) L += pL[k][g] * wR[k][g];
    mG[g] = M;
    lG[g] = L;
  }
}

template <int G, int CP>
__device__ __noinline__ void merge_weights(const float (&pM)[CP][G], const float (&pL)[CP][G],
                                           int cused, float (&wR)[CP][G], float (&mG)[G],
                                           float (&lG)[G]) {
  merge_weights_body<G, CP>(pM, pL, cused, wR, mG, lG);
}

// norm_rope_head (common.cuh) for two heads of one warp at once, the second (s1, w1) only when
// `two` (uniform in the warp): every load of both before either's arithmetic, then each
// head's sums and rotation as norm_rope_head forms them (the same expressions: the same bits).
template <typename T, int PER>
__device__ __forceinline__ void norm_rope_two(const T* __restrict__ s0, const T* __restrict__ w0,
                                              const T* __restrict__ s1, const T* __restrict__ w1,
                                              bool two, const float* __restrict__ inv_freq,
                                              float pos, float eps, int lane, float (&o0)[PER],
                                              float (&o1)[PER]) {
  constexpr int HDH = 32 * PER;
  float v0[PER], v1[PER], g0[PER], g1[PER], fr[PER / 2];
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    v0[j] = to_f(s0[lane + 32 * j]);
    g0[j] = to_f(w0[lane + 32 * j]);
    v1[j] = two ? to_f(s1[lane + 32 * j]) : 0.f;
    g1[j] = two ? to_f(w1[lane + 32 * j]) : 0.f;
  }
#pragma unroll
  for (int j = 0; j < PER / 2; ++j) fr[j] = inv_freq[lane + 32 * j];
  float ss0 = 0.f, ss1 = 0.f;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    ss0 += v0[j] * v0[j];
    ss1 += v1[j] * v1[j];
  }
  const float inv0 = rsqrtf(warp_sum(ss0) / HDH + eps);
  const float inv1 = rsqrtf(warp_sum(ss1) / HDH + eps);
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    v0[j] = v0[j] * inv0 * g0[j];
    v1[j] = v1[j] * inv1 * g1[j];
  }
#pragma unroll
  for (int j = 0; j < PER / 2; ++j) {
    float s, c;
    sincosf(pos * fr[j], &s, &c);
    const float a = v0[j], b = v0[j + PER / 2];
    o0[j] = a * c - b * s;
    o0[j + PER / 2] = b * c + a * s;
    const float a1 = v1[j], b1 = v1[j + PER / 2];
    o1[j] = a1 * c - b1 * s;
    o1[j + PER / 2] = b1 * c + a1 * s;
  }
}

}  // namespace
