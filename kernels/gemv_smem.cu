// Skinny matmuls of 1-2 token rows with each block's weight rows copied into shared memory
// before the wait on the kernel before it (LaunchOptions::gemv_smem): the same four kinds as
// gemv.cu (plain, gate|up with SiLU, both behind the fused add+RMSNorm), the same sums in the
// same order (bit for bit gemv_kernel's and the streamed / double-buffered kernels').
//
// Why: gemv.cu's kernels take a block per eight rows, two waves of blocks of ~90 registers, so
// the next kernel of the step launches (programmatic dependent launch) only once the last wave
// runs and finds no room on the SMs until they drain: its weight loads start at the tail. Here
// the grid is one block per SM (G <= N), block b taking rows [N b / G, N (b + 1) / G), and the
// block copies all of its rows (every part: gate and up) into shared memory with cp.async as
// its first act. With few registers and at most ~100 KB of shared memory a block, the next
// kernels' blocks fit beside it and copy their own weights while this one waits and sums: the
// weight traffic of consecutive matmuls overlaps the chain of dependent kernels.
//
// The shared memory a launch gets (read from %dynamic_smem_size) holds the weights of `cap`
// rows of every part, then (NORM) the T normed input rows: cap = (bytes / 2 - T K) / (NR K).
// Rows of the block past cap are read from global memory (the launcher gives every row room;
// this keeps other launches correct). K must be a multiple of 8.
//
//  * pgemv_t{T}_bf16, pgemv_silu_t{T}_bf16, pnorm_gemv_t{T}_bf16, pnorm_gemv_silu_t{T}_bf16:
//    gemv.cu's four kinds, same arguments (pf, pf_bytes unused).

#include "gemv.cuh"

namespace {

__device__ __forceinline__ unsigned dynamic_smem_bytes() {
  unsigned v;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
  return v;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

// NR 1: out[t][row] = W[row] . x[t]; NR 2: W is gate|up [2N, K], out = silu(gate) * up.
// NORM: x = rmsnorm(res + delta) * nw as norm_rows computes it (block 0 writes res_out).
template <int T, int NR, bool NORM>
__device__ __forceinline__ void pgemv_kernel(const __nv_bfloat16* __restrict__ W,
                                             const __nv_bfloat16* x,
                                             const __nv_bfloat16* __restrict__ delta,
                                             __nv_bfloat16* __restrict__ res_out,
                                             const __nv_bfloat16* __restrict__ nw, float eps,
                                             int add, __nv_bfloat16* __restrict__ out, int N,
                                             int K) {
  extern __shared__ __align__(16) __nv_bfloat16 smem[];
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = gridDim.x;
  const int r0 = (int)((long long)N * blockIdx.x / G);
  const int rows = (int)((long long)N * (blockIdx.x + 1) / G) - r0;
  const int cap = (int)(((long long)dynamic_smem_bytes() / 2 - (NORM ? T * K : 0)) / (NR * K));
  const int pre = min(rows, max(cap, 0));
  // The block's first `pre` rows of each part are contiguous in W: part r at rows N r + r0.
  const int n16 = pre * (K / 8);
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const __nv_bfloat16* src = W + ((size_t)r * N + r0) * K;
    __nv_bfloat16* dst = smem + (size_t)r * pre * K;
    for (int c = threadIdx.x; c < n16; c += WARPS * 32) cp_async16(dst + (size_t)c * 8, src + (size_t)c * 8);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  pdl_wait();
  if (NORM) {
    __nv_bfloat16* x_s = smem + (size_t)max(cap, 0) * NR * K;
    norm_rows<T>(x, delta, res_out, nw, eps, add, K, x_s);
    x = x_s;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  const PlainX xs{x, K};
  const int chunks = K / 8;
  for (int lr = warp; lr < rows; lr += WARPS) {
    // This row's parts, in shared memory or (past cap) in W.
    const __nv_bfloat16* base[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r)
      base[r] = lr < pre ? smem + ((size_t)r * pre + lr) * K : W + ((size_t)r * N + r0 + lr) * K;
    float acc[NR][T];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
    // Chunks lane, lane + 32, ... in order: dot_rows' sums.
#pragma unroll 4
    for (int c = lane; c < chunks; c += 32) {
      uint4 w[NR][BATCH];
#pragma unroll
      for (int r = 0; r < NR; ++r) w[r][0] = *reinterpret_cast<const uint4*>(base[r] + (size_t)c * 8);
      sum_chunk<T, NR>(xs, c, w, 0, acc);
    }
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
    store_rows<T, NR>(acc, out, N, r0 + lr, lane);
  }
}

}  // namespace

#define PGEMV(T)                                                                             \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) pgemv_t##T##_bf16(                \
      const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* out, int N, int K,      \
      const void* pf, unsigned long long pf_bytes) {                                         \
    (void)pf;                                                                                \
    (void)pf_bytes;                                                                          \
    pgemv_kernel<T, 1, false>(W, x, nullptr, nullptr, nullptr, 0.f, 0, out, N, K);           \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) pgemv_silu_t##T##_bf16(           \
      const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* out, int I, int K,      \
      const void* pf, unsigned long long pf_bytes) {                                         \
    (void)pf;                                                                                \
    (void)pf_bytes;                                                                          \
    pgemv_kernel<T, 2, false>(W, x, nullptr, nullptr, nullptr, 0.f, 0, out, I, K);           \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) pnorm_gemv_t##T##_bf16(           \
      const __nv_bfloat16* W, const __nv_bfloat16* res, const __nv_bfloat16* delta,          \
      __nv_bfloat16* res_out, const __nv_bfloat16* nw, float eps, int add,                   \
      __nv_bfloat16* out, int N, int K, const void* pf, unsigned long long pf_bytes) {       \
    (void)pf;                                                                                \
    (void)pf_bytes;                                                                          \
    pgemv_kernel<T, 1, true>(W, res, delta, res_out, nw, eps, add, out, N, K);               \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) pnorm_gemv_silu_t##T##_bf16(      \
      const __nv_bfloat16* W, const __nv_bfloat16* res, const __nv_bfloat16* delta,          \
      __nv_bfloat16* res_out, const __nv_bfloat16* nw, float eps, int add,                   \
      __nv_bfloat16* out, int I, int K, const void* pf, unsigned long long pf_bytes) {       \
    (void)pf;                                                                                \
    (void)pf_bytes;                                                                          \
    pgemv_kernel<T, 2, true>(W, res, delta, res_out, nw, eps, add, out, I, K);               \
  }

PGEMV(1)
PGEMV(2)
