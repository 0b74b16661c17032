// The fused decode attention's cluster helpers and its o fold (LaunchOptions::fused_o):
// included by fused_decode.cu only (in its anonymous namespace).
#pragma once

#include "decode_mma.cuh"

namespace {

// Blocks in this block's cluster and its rank there (1 and 0 without clusters).
__device__ __forceinline__ int cluster_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return (int)cooperative_groups::this_cluster().num_blocks();
#else
  return 1;
#endif
}

// Cluster barrier halves (sm_90; every thread of every block that has not exited takes
// part): arrive (release: this thread's earlier writes, shared memory of other blocks
// included, are visible to whoever waits after it), and wait (for every thread of the cluster
// that has not exited to have arrived).
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// Block `rank`'s shared-memory address of p (a variable of this kernel's shared memory).
template <typename V>
__device__ __forceinline__ V* cluster_peer(V* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  return p;
#endif
}

// ---- The o fold (LaunchOptions::fused_o) ---------------------------------------------------
//
// A 1-row decode step whose context fits one cluster can run the o projection inside
// the fused attention: every block of a KV head's cluster merges the cluster's partials itself
// (each block pushes its partial into every block's shared memory: o_push), rounds the heads' output
// to bf16 as the unfused path stores it, and multiplies it by its share of o's columns for
// those heads: rows rank * R .. rank * R + R - 1 (R = hidden / C) of the [hidden, nh * HD]
// weight, columns kh * G * HD .. + G * HD, staged into shared memory (cp.async) before the
// wait on the qkv matmul. The f32 sums go to o_part[b][kh][row]; the next kernel (the
// gate|up matmul's add + RMSNorm, gemv.cu's spdnorm_gemv_silu) adds the KV heads' partials
// in head order and rounds the sum to bf16 as o's output. Only the sum's order differs from
// the o matmul's (f32).

// Where the staged weights start in the kernel's dynamic shared memory (past the MMA stages
// and the states over them; attention_handles.rs sizes launches alike), and the most bytes
// of them a block takes (the host folds o only within it).
template <typename KT, int MMA>
__host__ __device__ constexpr int O_BASE() {
  return MMA_WARPS * MMA * stage_bytes<KT>() > MMA_STATES_BYTES ? MMA_WARPS * MMA * stage_bytes<KT>()
                                                                 : MMA_STATES_BYTES;
}
constexpr int O_SMEM_MAX = 64 * 1024;

// The o fold's exchange: this block's partial (slot `rank` of its own pM / pL / pA, written
// by the block) into the same slot of every other block of the cluster, 16 bytes a store.
template <int G, int CP>
__device__ __forceinline__ void o_push(float (&pM)[CP][G], float (&pL)[CP][G],
                                       float (&pA)[CP][G][HD], int rank, int C) {
  constexpr int V = G * HD / 4;  // float4s of a partial
  __syncthreads();
  const float4* src = reinterpret_cast<const float4*>(&pA[rank][0][0]);
  for (int i = threadIdx.x; i < (C - 1) * V; i += THREADS) {
    const int q = (rank + 1 + i / V) % C;
    reinterpret_cast<float4*>(cluster_peer(&pA[rank][0][0], q))[i % V] = src[i % V];
  }
  for (int i = threadIdx.x; i < (C - 1) * G; i += THREADS) {
    const int q = (rank + 1 + i / G) % C, g = i % G;
    cluster_peer(&pM[rank][0], q)[g] = pM[rank][g];
    cluster_peer(&pL[rank][0], q)[g] = pL[rank][g];
  }
}

// Copies this block's share of o (R rows of G * HD columns, row-major, 16 bytes a lane and
// copy) into ow and commits it as one cp.async group.
template <int G>
__device__ __forceinline__ void o_stage(unsigned char* ow, const __nv_bfloat16* __restrict__ o_w,
                                        int nh, int kh, int rank, int R) {
  constexpr int CPR = G * HD / 8;  // 16-byte pieces of a row's share
  const __nv_bfloat16* src = o_w + (size_t)rank * R * nh * HD + (size_t)kh * G * HD;
  for (int i = threadIdx.x; i < R * CPR; i += THREADS) {
    const int r = i / CPR, c = i % CPR;
    cp_async16(smem_addr(ow + (size_t)i * 16), src + (size_t)r * nh * HD + c * 8, true);
  }
  cp_async_commit();
}

// o_part[row] = W[row] . x over this block's R rows (x: the G heads' merged output as bf16,
// G * HD in shared memory): W staged by o_stage in ow (and waited for), or with GL read from
// gw (global memory, rows ld apart) a batch of OB rows a warp at a time. A warp takes a row at
// a time, a lane 8 columns (16 for G 4), the lanes' sums by warp_sum.
template <int G, bool GL>
__device__ __forceinline__ void o_rows(const unsigned char* ow, const __nv_bfloat16* gw, int ld,
                                       const __nv_bfloat16* x, int R, float* __restrict__ o_part) {
  constexpr int CPR = G * HD / 8, LC = (CPR + 31) / 32, OB = 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float xv[LC][8];
#pragma unroll
  for (int j = 0; j < LC; ++j) {
    const int c = lane + 32 * j;
    if (c < CPR) load8(x + c * 8, xv[j]);
  }
  for (int r0 = warp; r0 < R; r0 += OB * (THREADS / 32)) {
    uint4 w[OB][LC];
#pragma unroll
    for (int u = 0; u < OB; ++u) {
      const int r = r0 + u * (THREADS / 32);
#pragma unroll
      for (int j = 0; j < LC; ++j) {
        const int c = lane + 32 * j;
        if (r < R && c < CPR)
          w[u][j] = GL ? *reinterpret_cast<const uint4*>(gw + (size_t)r * ld + c * 8)
                       : *reinterpret_cast<const uint4*>(ow + ((size_t)r * CPR + c) * 16);
      }
    }
#pragma unroll
    for (int u = 0; u < OB; ++u) {
      const int r = r0 + u * (THREADS / 32);
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < LC; ++j) {
        const int c = lane + 32 * j;
        if (r < R && c < CPR) {
          float wf[8];
          bf16x8_to_f32(w[u][j], wf);
#pragma unroll
          for (int i = 0; i < 8; ++i) s += wf[i] * xv[j][i];
        }
      }
      s = warp_sum(s);
      if (lane == 0 && r < R) o_part[r] = s;
    }
  }
}

}  // namespace
