// The fused decode attention's cluster helpers, and its qkv phase (LaunchOptions::attn_qkv):
// the layer's add + RMSNorm + qkv matmul of a 1-row step inside the attention's clusters, so
// that the qkv output reaches the attention through a cluster barrier instead of a launch
// boundary. Included by fused_decode.cu after attention.cuh.
//
// The qkv phase. A cluster of C blocks serves one KV head: the (G + 2) * 128 rows of its G q
// heads, its k and its v head, rb = that / C rows a block (a contiguous range of the weight).
//  1. Before the wait on the kernel before (the weights are written by no kernel of the step),
//     warp 0 copies the block's rb rows into dynamic shared memory (cp.async.bulk, a row a lane
//     in turn, one mbarrier).
//  2. After it, every block norms the step's residual row (res + delta) into shared memory
//     exactly as gemv.cu's norm kernels do with their 8 warps (norm_rows, or
//     norm_rows_deferred for QKV 3: the same partial sums, the same order), and one block of
//     the grid writes the summed residual to res_out.
//  3. Each warp sums rows w, w + 4, ... of the block's rows as gemv.cuh's dot_rows does (lane l
//     takes chunks l, l + 32, ...; fmaf over the 8 inputs of a chunk; the warp's butterfly)
//     and rounds to bf16: the bits of the qkv matmul's output.
//  4. The block's rb values go into every block's copy of the cluster's (G + 2) * 128 values
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
// goes, the norm's weight and eps, and the offset of the weight rows in dynamic shared memory
// (after the attention's own; the normed row follows them).
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
};
static_assert(sizeof(FusedQkvParams) == 56, "FusedQkvParams layout");

constexpr int QKV_MAX_RB = 64;      // rows a block at most (the host checks)
constexpr int NORM_THREADS = 256;   // the threads of gemv.cu's norm kernels (8 warps)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// Step 1 (thread 0 initialises `bar`; warp 0 issues the copies): rows r0 .. r0 + rb of w into
// ws. The caller synchronizes the block before anyone waits on `bar`.
__device__ __forceinline__ void qkv_rows_load(const FusedQkvParams& q, int r0, int rb,
                                              __nv_bfloat16* ws, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x >= 32) return;
  const uint32_t row_bytes = (uint32_t)q.K * 2;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
                 "r"(row_bytes * (uint32_t)rb)
                 : "memory");
  }
  __syncwarp();
  for (int i = threadIdx.x; i < rb; i += 32)
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(smem_u32(ws + (size_t)i * q.K)),
        "l"(q.w + (size_t)(r0 + i) * q.K), "r"(row_bytes), "r"(smem_u32(bar))
        : "memory");
#endif
}

// Every thread: until the rows of step 1 are in shared memory.
__device__ __forceinline__ void qkv_rows_wait(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t ok = 0;
  while (!ok)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(ok)
        : "r"(smem_u32(bar))
        : "memory");
#endif
}

// Step 2: x_s = the normed row as gemv.cu's norm kernels hold it (QKV 1: norm_rows; 3:
// norm_rows_deferred, whose scale is returned for the sums), with their 256 threads' partial
// sums emulated by this block's 128 (thread t takes the parts of threads t and t + 128).
// `writer`: this block writes the summed residual to res_out.
template <int QKV>
__device__ float qkv_norm(const FusedQkvParams& q, __nv_bfloat16* x_s, bool writer) {
  constexpr int V = NORM_THREADS / THREADS;  // emulated threads a thread
  const int K = q.K;
  float part[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    part[v] = 0.f;
    for (int k = threadIdx.x + v * THREADS; k < K; k += NORM_THREADS) {
      float x = __bfloat162float(q.res[k]);
      if (q.add) {
        const __nv_bfloat16 s = __float2bfloat16(x + __bfloat162float(q.delta[k]));
        if (QKV == 3 && writer) q.res_out[k] = s;
        x = __bfloat162float(s);
      }
      x_s[k] = __float2bfloat16(QKV == 3 ? x * __bfloat162float(q.nw[k]) : x);
      part[v] += x * x;
    }
  }
  __shared__ float ss[NORM_THREADS / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const float s = warp_sum(part[v]);
    if (lane == 0) ss[warp + v * (THREADS / 32)] = s;
  }
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < NORM_THREADS / 32; ++i) tot += ss[i];
  const float inv = rsqrtf(tot / K + q.eps);
  if (QKV == 1) {
    for (int k = threadIdx.x; k < K; k += THREADS) {
      const __nv_bfloat16 r = x_s[k];
      if (q.add && writer) q.res_out[k] = r;
      x_s[k] = __float2bfloat16(__bfloat162float(r) * inv * __bfloat162float(q.nw[k]));
    }
  }
  __syncthreads();
  return inv;
}

// Steps 3 and 4: the block's rb rows (ws) against x_s into mine, then into slots rank * rb ..
// of every block's `all` (cluster barrier included: on return every block's `all` is whole).
// The caller has waited for every block of the cluster to have started.
template <int QKV>
__device__ void qkv_rows_sum(const __nv_bfloat16* ws, const __nv_bfloat16* x_s, float inv, int K,
                             int rb, int rank, int C, __nv_bfloat16* mine,
                             __nv_bfloat16* all) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < rb; r += THREADS / 32) {
    const __nv_bfloat16* wr = ws + (size_t)r * K;
    float acc = 0.f;
    for (int c = lane; c < K / 8; c += 32) {
      float wf[8], xf[8];
      bf16x8_to_f32(reinterpret_cast<const uint4*>(wr)[c], wf);
      bf16x8_to_f32(reinterpret_cast<const uint4*>(x_s)[c], xf);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc = fmaf(wf[j], xf[j], acc);
    }
    acc = warp_sum(acc);
    if (QKV == 3) acc *= inv;
    if (lane == 0) mine[r] = __float2bfloat16(acc);
  }
  __syncthreads();
  const int pieces = rb / 8;  // 16-byte pieces a block's values
  for (int i = threadIdx.x; i < C * pieces; i += THREADS) {
    const int peer = i / pieces, pc = i % pieces;
    *cluster_peer(reinterpret_cast<uint4*>(all + rank * rb) + pc, peer) =
        reinterpret_cast<const uint4*>(mine)[pc];
  }
  cluster_arrive();
  cluster_wait();
}

}  // namespace
