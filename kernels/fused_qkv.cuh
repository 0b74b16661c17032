// The qkv matmul inside the fused decode attention (`fused_qkv.cu`, LaunchOptions::fused_qkv):
// for a 1-row step whose context fits one cluster, the cluster of KV head kh computes that
// head's rows of the layer's add + RMSNorm + qkv matmul itself, instead of reading them from the
// qkv kernel's output, so a layer has one launch and one dependent wait fewer. GQA group 2 (a
// KV head's G q heads, its k and v head: (G + 2) * 128 rows), clusters of QKV_CLUSTER blocks,
// each block QKV_ROWS of those rows:
//  1. before the wait, thread 0 sets up two mbarriers and starts one bulk copy of the block's
//     weight rows (contiguous, RPB * K bf16) into dynamic shared memory, evict-first in L2;
//  2. after it, the block norms the input row into shared memory exactly as the skinny
//     matmul's norm kernel of 256 threads does (gemv.cuh norm_rows / norm_rows_deferred: the
//     same per-thread sums, warp sums and order over its eight warps, emulated by 128 threads),
//     and one block writes bf16(res + delta) to res_out;
//  3. each warp forms its rows' dot products as dot_rows does (lane l: chunks l, l + 32, ...,
//     eight FMAs a chunk in order, then the butterfly), rounds them to bf16 as the qkv kernel
//     stores them, and stores them by st.async into every block's `qkv_s` (two rows a 32-bit
//     store), counted on each block's exchange mbarrier;
//  4. the block waits on its exchange mbarrier: `qkv_s` holds the head's rows as the qkv
//     kernel would have written them, and the attention goes on from there.
// The same bits as the qkv kernel followed by the fused attention (`kernel_check` holds them).
#pragma once

#include "cluster.cuh"
#include "common.cuh"

namespace {

constexpr int QKV_CLUSTER = 16;  // blocks of a cluster (1-row steps, groups 1-2)
constexpr int QKV_MAX_K = 2048;  // widest input row (the weights' shared memory)

// The qkv prologue's inputs (FusedQkvParams on the host side, after FusedDecodeParams).
struct QkvIn {
  const __nv_bfloat16* w;      // the layer's qkv weight [(nh + 2 nkv) * 128, K]
  const __nv_bfloat16* res;    // the residual row [K]
  const __nv_bfloat16* delta;  // what is added to it [K] (add 1; else res)
  __nv_bfloat16* res_out;      // bf16(res + delta) [K], by one block (add 1)
  const __nv_bfloat16* nw;     // the input norm's weight [K]
  float eps;
  int K;
  int add;
  int deferred;  // the norm's scale on the sums (norm_rows_deferred), else on the inputs
};

struct FusedQkvParams {
  FusedDecodeParams d;
  QkvIn q;
};
static_assert(sizeof(FusedQkvParams) == 168 + 56 && offsetof(FusedQkvParams, q) == 168 &&
                  offsetof(QkvIn, eps) == 40,
              "FusedQkvParams layout");

// Rows of the block (of the head's (G + 2) * 128) and of each of its four warps.
template <int G>
__host__ __device__ constexpr int qkv_rows_per_block() {
  return (G + 2) * 128 / QKV_CLUSTER;
}

// The weight row of the head's row j (< (G + 2) * 128) for KV head kh of nkv, nh q heads.
template <int G>
__device__ __forceinline__ size_t qkv_weight_row(int j, int kh, int nh, int nkv) {
  if (j < G * 128) return (size_t)kh * G * 128 + j;
  if (j < (G + 1) * 128) return (size_t)(nh + kh) * 128 + (j - G * 128);
  return (size_t)(nh + nkv + kh) * 128 + (j - (G + 1) * 128);
}

// 1 (thread 0, before the wait and before the cluster's first arrival): the exchange barrier
// (expecting the head's (G + 2) * 128 bf16 from the cluster's blocks) and the weights' barrier
// with its bulk copy of the block's rows into ws.
template <int G>
__device__ __forceinline__ void qkv_fetch(const QkvIn& q, int rank, int kh, int nh, int nkv,
                                          __nv_bfloat16* ws, uint64_t* wbar, uint64_t* xbar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int RPB = qkv_rows_per_block<G>();
  const uint32_t bytes = (uint32_t)(RPB * q.K * 2);
  push_bar_init(xbar, (uint32_t)((G + 2) * 128 * 2));
  push_bar_init(wbar, bytes);
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  const __nv_bfloat16* src = q.w + qkv_weight_row<G>(rank * RPB, kh, nh, nkv) * q.K;
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"((uint32_t)__cvta_generic_to_shared(ws)),
      "l"(src), "r"(bytes), "r"((uint32_t)__cvta_generic_to_shared(wbar)), "l"(policy)
      : "memory");
#endif
}

// 2: x_s = the normed input row, as gemv.cuh's norm kernels of 256 threads form it (thread v
// of those 256 is thread v % 128 here, sum v / 128); `inv` the norm's scale (deferred: the
// caller's sums take it). `writer`: this block writes res_out.
__device__ __forceinline__ void qkv_norm(const QkvIn& q, bool writer, __nv_bfloat16* x_s,
                                         float& inv) {
  constexpr int VT = 256;  // the norm kernels' threads
  __shared__ float ss[VT / 32];
  const int K = q.K, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float part = 0.f;
    for (int k = threadIdx.x + 128 * h; k < K; k += VT) {
      float v = __bfloat162float(q.res[k]);
      if (q.deferred) {
        if (q.add) {
          const __nv_bfloat16 s = __float2bfloat16(v + __bfloat162float(q.delta[k]));
          if (writer) q.res_out[k] = s;
          v = __bfloat162float(s);
        }
        x_s[k] = __float2bfloat16(v * __bfloat162float(q.nw[k]));
      } else {
        if (q.add) v = __bfloat162float(__float2bfloat16(v + __bfloat162float(q.delta[k])));
        x_s[k] = __float2bfloat16(v);
      }
      part += v * v;
    }
    const float s = warp_sum(part);
    if (lane == 0) ss[warp + 4 * h] = s;
  }
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < VT / 32; ++i) tot += ss[i];
  inv = rsqrtf(tot / K + q.eps);
  if (!q.deferred) {
    for (int k = threadIdx.x; k < K; k += 128) {
      const __nv_bfloat16 r = x_s[k];
      if (q.add && writer) q.res_out[k] = r;
      x_s[k] = __float2bfloat16(__bfloat162float(r) * inv * __bfloat162float(q.nw[k]));
    }
    __syncthreads();
  }
}

// 3 and 4: the block's rows (weights ws, once wbar has them) against x_s, into every block's
// qkv_s (st.async counted on each one's xbar), then this block's xbar waited for. Every block
// of the cluster must have passed its first cluster arrival (the barriers set up).
template <int G>
__device__ __forceinline__ void qkv_rows(const QkvIn& q, int rank, const __nv_bfloat16* ws,
                                         const __nv_bfloat16* x_s, float inv, uint64_t* wbar,
                                         uint64_t* xbar, __nv_bfloat16* qkv_s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int RPB = qkv_rows_per_block<G>(), RPW = RPB / 4;
  static_assert(RPW % 2 == 0, "two rows a 32-bit store");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, chunks = q.K / 8;
  push_bar_wait(wbar);
  // Lane l < QKV_CLUSTER stores into block l.
  const uint32_t dst = cluster_addr(qkv_s, lane % QKV_CLUSTER);
  const uint32_t bar = cluster_addr(xbar, lane % QKV_CLUSTER);
  const uint4* xv = reinterpret_cast<const uint4*>(x_s);
#pragma unroll 1
  for (int i = 0; i < RPW; i += 2) {
    float acc[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint4* wv = reinterpret_cast<const uint4*>(ws + (size_t)(warp * RPW + i + r) * q.K);
      float a = 0.f;
      for (int c = lane; c < chunks; c += 32) {
        float wf[8], xf[8];
        bf16x8_to_f32(wv[c], wf);
        bf16x8_to_f32(xv[c], xf);
#pragma unroll
        for (int j = 0; j < 8; ++j) a = fmaf(wf[j], xf[j], a);
      }
      a = warp_sum(a);
      if (q.deferred) a *= inv;
      acc[r] = a;
    }
    const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16(acc[0]));
    const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16(acc[1]));
    const int j = rank * RPB + warp * RPW + i;  // the head's row of acc[0]
    if (lane < QKV_CLUSTER)
      asm volatile(
          "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(
              dst + (uint32_t)j * 2u),
          "r"(lo | (hi << 16)), "r"(bar)
          : "memory");
  }
  push_bar_wait(xbar);
#endif
}

}  // namespace
