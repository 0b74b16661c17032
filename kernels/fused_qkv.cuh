// The fused decode attention's cluster helpers, and its qkv phase (LaunchOptions::attn_qkv):
// the layer's add + RMSNorm + qkv matmul of a 1-row step inside the attention's clusters, so
// that the qkv output reaches the attention through a cluster barrier instead of a launch
// boundary. Included by fused_decode.cu after attention.cuh.
//
// The qkv phase. A cluster of 16 blocks serves one KV head: the (G + 2) * 128 rows of its G q
// heads, its k and its v head, QRB = 32 a block (a contiguous range of the weight), QRW = 8 a
// warp (rows w, w + 4, ...).
//  1. Before the wait on the kernel before (the weights are written by no kernel of the
//     step), each lane loads its chunks (8 inputs) of the warp's rows among the first
//     RC * 256 inputs into registers, as gemv.cuh's load_batch does (chunks l, l + 32, ...),
//     and warp 0 copies the rest of the block's rows into dynamic shared memory
//     (cp.async.bulk, one mbarrier). RC 4 (LaunchOptions::attn_qkv Registers: 1,024 inputs a
//     row, 128 registers a thread) or 0 (Shared: every input in shared memory). Either way the
//     block must fit twice on an SM: the GPU holds only 7 clusters of 16 blocks at once at one
//     block an SM, and 8 are needed (cuOccupancyMaxActiveClusters, H200).
//  2. After it, every block norms the step's residual row (res + delta) into shared memory
//     exactly as gemv.cu's norm kernels do with their 8 warps (norm_rows, or
//     norm_rows_deferred for QKV 3: the same partial sums, the same order), and one block of
//     the grid writes the summed residual to res_out.
//  3. Each warp sums its rows as gemv.cuh's dot_rows does (lane l takes chunks l, l + 32, ...
//     in order; fmaf over the 8 inputs of a chunk; the warp's butterfly) and rounds to bf16:
//     the bits of the qkv matmul's output.
//  4. The block's 32 values go into every block's copy of the cluster's (G + 2) * 128 values
//     (distributed shared memory), behind a cluster barrier.
#pragma once

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

// The qkv phase's inputs (`FusedQkvParams` of src/engine/cuda/params.rs): the qkv weight
// [(nh + 2 nkv) * 128, K], the residual row, the delta added to it (add 1) and where the sum
// goes, the norm's weight and eps, and where in dynamic shared memory (bytes) the rows' inputs
// past REG_K go (w_off), the normed row (x_off) and the cluster merge's partials (pa_off; the
// rows' space once they are summed, when it is large enough).
struct FusedQkvParams {
  const __nv_bfloat16* w;
  const __nv_bfloat16* res;
  const __nv_bfloat16* delta;
  __nv_bfloat16* res_out;
  const __nv_bfloat16* nw;
  float eps;
  int add;
  int K;
  int w_off;
  int x_off;
  int pa_off;
};
static_assert(sizeof(FusedQkvParams) == 64, "FusedQkvParams layout");

constexpr int QRB = 32;            // rows a block (the host launches clusters of 16)
constexpr int QRW = QRB / 4;       // rows a warp
// Chunks a lane a row in registers: the array's size (at least 1) for RC of them.
template <int RC>
using RegRows = uint4[QRW][RC > 0 ? RC : 1];
constexpr int NORM_THREADS = 256;  // the threads of gemv.cu's norm kernels (8 warps)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ uint4 ld_weights(const __nv_bfloat16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Step 1: this lane's RC register chunks of the warp's rows (block rows warp + 4 j, weight
// rows r0 + that), and (thread 0 initialises `bar`; warp 0 issues the copies) the rows' inputs
// past RC * 256 into ws. The caller synchronizes the block before anyone waits on `bar`.
template <int RC>
__device__ __forceinline__ void qkv_rows_load(const FusedQkvParams& q, int r0, RegRows<RC>& wr,
                                              __nv_bfloat16* ws, uint64_t* bar) {
  constexpr int REG_K = RC * 256;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < QRW; ++j)
#pragma unroll
    for (int i = 0; i < RC; ++i)
      wr[j][i] = ld_weights(q.w + (size_t)(r0 + warp + 4 * j) * q.K + (lane + 32 * i) * 8);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (warp != 0 || q.K <= REG_K) return;
  const uint32_t row_bytes = (uint32_t)(q.K - REG_K) * 2;
  if (lane == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
                 "r"(row_bytes * (uint32_t)QRB)
                 : "memory");
  }
  __syncwarp();
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(smem_u32(ws + (size_t)lane * (q.K - REG_K))),
      "l"(q.w + (size_t)(r0 + lane) * q.K + REG_K), "r"(row_bytes), "r"(smem_u32(bar))
      : "memory");
#endif
}

// Every thread: until the copies of step 1 are in shared memory (none when K <= RC * 256).
template <int RC>
__device__ __forceinline__ void qkv_rows_wait(const FusedQkvParams& q, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t ok = q.K <= RC * 256;
  while (!ok)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(ok)
        : "r"(smem_u32(bar))
        : "memory");
#endif
}

// The norm weights a thread holds (elements t + 128 e), loaded before the wait: K <= 2048.
constexpr int NORM_E = 16;
__device__ __forceinline__ void qkv_norm_weights(const FusedQkvParams& q,
                                                 __nv_bfloat16 (&nw)[NORM_E]) {
#pragma unroll
  for (int e = 0; e < NORM_E; ++e) {
    const int k = threadIdx.x + THREADS * e;
    nw[e] = k < q.K ? q.nw[k] : __float2bfloat16(0.f);
  }
}

// Step 2: x_s = the normed row as gemv.cu's norm kernels hold it (QKV 1: norm_rows; 3:
// norm_rows_deferred, whose scale is returned for the sums), their 256 threads' partial sums
// emulated by this block's 128: element e of thread t (input t + 128 e) is the e / 2-th of
// thread t + 128 (e & 1) there. Every load is issued before any sum (one round trip).
// `writer`: this block writes the summed residual to res_out.
template <int QKV>
__device__ float qkv_norm(const FusedQkvParams& q, const __nv_bfloat16 (&nw)[NORM_E],
                          __nv_bfloat16* x_s, bool writer) {
  const int K = q.K;
  float xv[NORM_E], dv[NORM_E];
#pragma unroll
  for (int e = 0; e < NORM_E; ++e) {
    const int k = threadIdx.x + THREADS * e;
    xv[e] = k < K ? __bfloat162float(q.res[k]) : 0.f;
    dv[e] = k < K && q.add ? __bfloat162float(q.delta[k]) : 0.f;
  }
  float part[2] = {0.f, 0.f};
#pragma unroll
  for (int e = 0; e < NORM_E; ++e) {
    const int k = threadIdx.x + THREADS * e;
    if (k >= K) continue;
    float x = xv[e];
    if (q.add) {
      const __nv_bfloat16 s = __float2bfloat16(x + dv[e]);
      if (writer) q.res_out[k] = s;
      x = __bfloat162float(s);
    }
    xv[e] = x;
    if (QKV == 3) x_s[k] = __float2bfloat16(x * __bfloat162float(nw[e]));
    part[e & 1] += x * x;
  }
  __shared__ float ss[NORM_THREADS / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int v = 0; v < 2; ++v) {
    const float s = warp_sum(part[v]);
    if (lane == 0) ss[warp + v * (THREADS / 32)] = s;
  }
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < NORM_THREADS / 32; ++i) tot += ss[i];
  const float inv = rsqrtf(tot / K + q.eps);
  if (QKV == 1) {
#pragma unroll
    for (int e = 0; e < NORM_E; ++e) {
      const int k = threadIdx.x + THREADS * e;
      if (k < K) x_s[k] = __float2bfloat16(xv[e] * inv * __bfloat162float(nw[e]));
    }
  }
  __syncthreads();
  return inv;
}

// Steps 3 and 4: the warp's rows (registers wr, then ws past RC * 256) against x_s into mine,
// then into slots rank * QRB .. of every block's `all` (cluster barrier included: on return
// every block's `all` is whole). The caller has waited for every block of the cluster to have
// started.
template <int QKV, int RC>
__device__ void qkv_rows_sum(const RegRows<RC>& wr, const __nv_bfloat16* ws,
                             const __nv_bfloat16* x_s, float inv, int K, int rank,
                             __nv_bfloat16* mine, __nv_bfloat16* all) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < QRW; ++j) {
    const int r = warp + 4 * j;
    float acc = 0.f;
    auto chunk = [&](uint4 wv, int c) {
      float wf[8], xf[8];
      bf16x8_to_f32(wv, wf);
      bf16x8_to_f32(reinterpret_cast<const uint4*>(x_s)[c], xf);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc = fmaf(wf[e], xf[e], acc);
    };
#pragma unroll
    for (int i = 0; i < RC; ++i) chunk(wr[j][i], lane + 32 * i);
    constexpr int REG_K = RC * 256;
    const uint4* wsr = reinterpret_cast<const uint4*>(ws + (size_t)r * (K - REG_K));
    for (int c = lane + REG_K / 8; c < K / 8; c += 32) chunk(wsr[c - REG_K / 8], c);
    acc = warp_sum(acc);
    if (QKV == 3) acc *= inv;
    if (lane == 0) mine[r] = __float2bfloat16(acc);
  }
  __syncthreads();
  constexpr int PIECES = QRB / 8;  // 16-byte pieces a block's values
  const int C = cluster_blocks();
  for (int i = threadIdx.x; i < C * PIECES; i += THREADS) {
    const int peer = i / PIECES, pc = i % PIECES;
    *cluster_peer(reinterpret_cast<uint4*>(all + rank * QRB) + pc, peer) =
        reinterpret_cast<const uint4*>(mine)[pc];
  }
  cluster_arrive();
  cluster_wait();
}

}  // namespace
