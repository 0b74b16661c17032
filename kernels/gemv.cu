// Skinny matmuls of decode steps (T <= 2 token rows), bf16 weights and activations, f32
// accumulation: out[t][n] = sum_k x[t][k] * W[n][k] for a row-major weight W [N, K] (a linear
// layer's layout). At so few rows a step is bound by reading W once and by latency, so each kernel
// does as much of the layer as it can in one launch.
//
// A warp takes one output row (two for the gate/up pair): each lane loads 16 bytes (8
// weights) per chunk, up to 8 chunks in flight (streamed past L1), multiplies them by the same
// 8 elements of each of the T activation rows and accumulates in f32; a warp reduction ends
// the row. Blocks hold 8 warps. K must be a multiple of 8 (16-byte aligned rows).
//
// The weights are the only memory no kernel of a step writes, so each warp issues its first
// batch of weight loads before waiting on the kernel before it (programmatic dependent launch,
// common.cuh): in a chain of launches a matmul's weight reads overlap the previous kernel.
//
//  * gemv_t{T}_bf16:        out [T, N] = x W^T
//  * gemv_silu_t{T}_bf16:   W is gate|up [2I, K]; out [T, I] = silu(x gate^T) * (x up^T)
//  * norm_gemv_t{T}_bf16, norm_gemv_silu_t{T}_bf16: the same on x = rmsnorm(res + delta) * w,
//    computed by every block into shared memory (K <= 4096); block 0 also writes
//    res + delta (rounded to bf16, as the residual stream is stored) to res_out, a buffer other
//    than res (no block may see another's write). Without delta (add == 0) res is normed as
//    is and res_out is not written.
//  * wnorm_gemv_t{T}_bf16, wnorm_gemv_silu_t{T}_bf16: the norm kernels with the per-warp norm
//    (WarpNorm: no shared memory, no block barrier; warp 0 of block 0 writes res_out).
//  * sgemv_silu_t{T}_bf16, snorm_gemv_silu_t{T}_bf16 (T = 1, 2): the gate|up kernels on
//    streamed rows (their loops in gemv_stream.cuh), bit for bit; `_st_t1`: at one row with
//    each warp's second batch staged in shared memory before the wait.
//  * gemv_db_t{T}_bf16, norm_gemv_db_t{T}_bf16 (T = 1, 2): gemv/norm_gemv with two batches of
//    weight loads in flight (dot_rows2), bit for bit.
//  * gemv_split_t{T}_bf16 (T = 1, 2): gemv with two warps a row, a half of K each (below).
//  * the same four on tensor cores for 3..8 rows: gemv_mma.cu.
//
// Every kernel also takes (pf, pf_bytes): weights of a later kernel of the step, which its
// blocks prefetch into L2 while it runs (l2_prefetch_share; pf_bytes 0: none).

#include "gemv.cuh"
#include "gemv_stream.cuh"

namespace {

// bf16(a + b) element-wise, as the residual stream is stored.
__device__ __forceinline__ uint4 add_bf16x8(uint4 a, uint4 b) {
  float fa[8], fb[8];
  bf16x8_to_f32(a, fa);
  bf16x8_to_f32(b, fb);
  uint4 o;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(fa[2 * i] + fb[2 * i], fa[2 * i + 1] + fb[2 * i + 1]);
  return o;
}

// The per-warp fused norm: x[t] = bf16(bf16(res + delta)[t] * inv[t] * w) with inv[t] from one
// pass of this warp over the T rows (no shared memory, no block barrier: each warp starts its
// dot products as soon as its own sums are in); chunks are rebuilt from res/delta/w as the
// dot products need them (L1-resident: every warp of the block reads the same rows).
template <int T>
struct WarpNorm {
  const __nv_bfloat16* res;
  const __nv_bfloat16* delta;
  const __nv_bfloat16* w;
  int add, K;
  float inv[T];

  // The sums of squares (and, by warp 0 of block 0, res + delta written to res_out).
  __device__ __forceinline__ void init(__nv_bfloat16* __restrict__ res_out, float eps, int lane) {
    float ss[T];
#pragma unroll
    for (int t = 0; t < T; ++t) ss[t] = 0.f;
    const bool writer = add && blockIdx.x == 0 && threadIdx.x < 32;
    for (int c = lane; c < K / 8; c += 32) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const uint4 v = sum(t, c);
        if (writer) *reinterpret_cast<uint4*>(res_out + (size_t)t * K + c * 8) = v;
        float f[8];
        bf16x8_to_f32(v, f);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss[t] += f[j] * f[j];
      }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) inv[t] = rsqrtf(warp_sum(ss[t]) / K + eps);
  }

  __device__ __forceinline__ uint4 sum(int t, int c) const {
    const uint4 r = *reinterpret_cast<const uint4*>(res + (size_t)t * K + c * 8);
    return add ? add_bf16x8(r, *reinterpret_cast<const uint4*>(delta + (size_t)t * K + c * 8)) : r;
  }

  __device__ __forceinline__ uint4 chunk(int t, int c) const {
    float v[8], g[8];
    bf16x8_to_f32(sum(t, c), v);
    bf16x8_to_f32(*reinterpret_cast<const uint4*>(w + c * 8), g);
    uint4 o;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      h[i] = __floats2bfloat162_rn(v[2 * i] * inv[t] * g[2 * i], v[2 * i + 1] * inv[t] * g[2 * i + 1]);
    return o;
  }
};

// dot_rows with two batches in flight (LaunchOptions::gemv_double_buffer): w holds the batch
// at lane and w2 the one after it (both loaded before the wait); while a batch is summed the
// next is in flight. The same sums in the same order.
template <int T, int NR, typename X>
__device__ __forceinline__ void dot_rows2(const __nv_bfloat16* __restrict__ W, const X& xs,
                                          const int (&rows)[NR], int K, int lane,
                                          uint4 (&w)[NR][BATCH], uint4 (&w2)[NR][BATCH],
                                          float (&acc)[NR][T]) {
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
  const int chunks = K / 8;
  for (int c0 = lane; c0 < chunks; c0 += 2 * 32 * BATCH) {
    const int c1 = c0 + 32 * BATCH, c2 = c1 + 32 * BATCH;
    sum_batch<T, NR>(xs, c0, chunks, w, acc);
    if (c1 >= chunks) break;
    if (c2 < chunks) load_batch<NR>(W, rows, K, c2, w);
    sum_batch<T, NR>(xs, c1, chunks, w2, acc);
    if (c2 + 32 * BATCH < chunks) load_batch<NR>(W, rows, K, c2 + 32 * BATCH, w2);
  }
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
}

// The output rows of this warp: one row (NR 1) or a gate/up pair (NR 2, up at N + row), and
// whether the warp has one (a block's last warps may not).
template <int NR>
__device__ __forceinline__ bool warp_rows(int N, int (&rows)[NR]) {
  const int row = blockIdx.x * WARPS + threadIdx.x / 32;
  const bool ok = row < N;
#pragma unroll
  for (int r = 0; r < NR; ++r) rows[r] = ok ? row + r * N : 0;
  return ok;
}

// The whole kernel: triggers the next launch, prefetches this warp's first weight batch,
// waits for the previous kernel, optionally norms the input rows into shared memory, then
// runs the dot products. NR 2 is the gate/up pair with SiLU (N = I).
// NORM: 0 none, 1 the block-wide norm into shared memory (norm_rows), 2 the per-warp norm
// (WarpNorm), 3 the block-wide norm with its scale deferred to the sums (norm_rows_deferred).
template <int T, int NR, int NORM, bool DB = false>
__device__ __forceinline__ void gemv_kernel(const __nv_bfloat16* __restrict__ W,
                                            const __nv_bfloat16* x,
                                            const __nv_bfloat16* __restrict__ delta,
                                            __nv_bfloat16* __restrict__ res_out,
                                            const __nv_bfloat16* __restrict__ nw, float eps,
                                            int add, __nv_bfloat16* __restrict__ out, int N,
                                            int K, __nv_bfloat16* x_s, const void* pf,
                                            unsigned long long pf_bytes) {
  pdl_trigger();
  l2_prefetch_share(pf, pf_bytes);
  const int lane = threadIdx.x % 32;
  int rows[NR];
  const bool ok = warp_rows<NR>(N, rows);
  uint4 w[NR][BATCH];
  uint4 w2[NR][DB ? BATCH : 1];
  if (ok) load_batch<NR>(W, rows, K, lane, w);
  if constexpr (DB) {
    if (ok) load_batch<NR>(W, rows, K, lane + 32 * BATCH, w2);
  }
  pdl_wait();
#ifdef X_SHARED
  // X_SHARED (gemv.cuh): the input into the entry's buffer by the whole block, then read there.
  if (NORM == 0 && x_s != nullptr && T * K <= XS_MAX) {
    for (int i = threadIdx.x; i < T * K / 8; i += WARPS * 32)
      reinterpret_cast<uint4*>(x_s)[i] = reinterpret_cast<const uint4*>(x)[i];
    __syncthreads();
    x = x_s;
  }
#endif
  float acc[NR][T];
  if (NORM == 2) {
    WarpNorm<T> xs{x, delta, nw, add, K, {}};
    xs.init(res_out, eps, lane);
    if (!ok) return;
    dot_rows<T, NR>(W, xs, rows, K, lane, w, acc);
  } else {
    float inv[T];
    if (NORM == 1) {
      norm_rows<T>(x, delta, res_out, nw, eps, add, K, x_s);
      x = x_s;
    } else if (NORM == 3) {
      norm_rows_deferred<T>(x, delta, res_out, nw, eps, add, K, x_s, inv);
      x = x_s;
    }
    if (!ok) return;
    if constexpr (DB) dot_rows2<T, NR>(W, PlainX{x, K}, rows, K, lane, w, w2, acc);
    else dot_rows<T, NR>(W, PlainX{x, K}, rows, K, lane, w, acc);
    if (NORM == 3) scale_rows<T, NR>(acc, inv);
  }
  store_rows<T, NR>(acc, out, N, rows[0], lane);
}

// ---- Rows split in two (LaunchOptions::gemv_split_k) ---------------------------------------
//
// For rows of more than BATCH * 256 inputs (down): two warps a row, each over one half of K
// (two batches of loads in flight, both issued before the wait), their sums added in shared
// memory, half 0 first. A block takes WARPS / 2 rows: twice the blocks and half the chain of
// batches a warp waits through. The sum is in another order than gemv_kernel's (f32). K must
// be a multiple of 16. Off by default: slower than gemv_db on 1.7B's down on the H200 (11.2
// against 9.9 us), within noise on 0.6B.
template <int T>
__device__ __forceinline__ void gemv_split_kernel(const __nv_bfloat16* __restrict__ W,
                                                  const __nv_bfloat16* x,
                                                  __nv_bfloat16* __restrict__ out, int N, int K) {
  __shared__ float part[WARPS][T];
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * (WARPS / 2) + warp / 2, half = warp % 2;
  const int hc = K / 16;  // chunks of a half
  const bool ok = row < N;
  const __nv_bfloat16* wr = W + (size_t)(ok ? row : 0) * K + (size_t)half * hc * 8;
  uint4 w[1][BATCH], w2[1][BATCH];
  auto load = [&](int c0, uint4 (&dst)[1][BATCH]) {
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int c = c0 + 32 * i;
      dst[0][i] = ok && c < hc ? ld_stream(wr + (size_t)c * 8) : make_uint4(0, 0, 0, 0);
    }
  };
  load(lane, w);
  load(lane + 32 * BATCH, w2);
  pdl_wait();
  float acc[1][T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[0][t] = 0.f;
  const PlainX xs{x + (size_t)half * hc * 8, K};
  for (int c0 = lane; c0 < hc; c0 += 2 * 32 * BATCH) {
    const int c1 = c0 + 32 * BATCH, c2 = c1 + 32 * BATCH;
    sum_batch<T, 1>(xs, c0, hc, w, acc);
    if (c1 >= hc) break;
    if (c2 < hc) load(c2, w);
    sum_batch<T, 1>(xs, c1, hc, w2, acc);
    if (c2 + 32 * BATCH < hc) load(c2 + 32 * BATCH, w2);
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float v = warp_sum(acc[0][t]);
    if (lane == 0) part[warp][t] = v;
  }
  __syncthreads();
  if (half == 0 && ok && lane < T) out[(size_t)lane * N + row] = __float2bfloat16(part[warp][lane] + part[warp + 1][lane]);
}

}  // namespace

// CUDA cores, a block per eight rows: plain, SiLU*up, both behind the block norm, and both
// behind the per-warp norm (WarpNorm; no shared memory used).
#define GEMV(T)                                                                              \
  PLAIN_ENTRY(gemv_t##T##_bf16, gemv_kernel<T, 1, 0>(PLAIN_ARGS))                            \
  PLAIN_ENTRY(gemv_silu_t##T##_bf16, gemv_kernel<T, 2, 0>(PLAIN_ARGS))                       \
  NORM_ENTRY(norm_gemv_t##T##_bf16, gemv_kernel<T, 1, 1>(NORM_ARGS))                         \
  NORM_ENTRY(norm_gemv_silu_t##T##_bf16, gemv_kernel<T, 2, 1>(NORM_ARGS))                    \
  NORM_ENTRY(wnorm_gemv_t##T##_bf16, gemv_kernel<T, 1, 2>(NORM_ARGS))                        \
  NORM_ENTRY(wnorm_gemv_silu_t##T##_bf16, gemv_kernel<T, 2, 2>(NORM_ARGS))

// The gate|up kernels on streamed rows (LaunchOptions::gemv_stream), alone and behind the norm
// (scale-first and deferred). 1 row: the general loop. 2 rows: whole rows a loop at 1,024 and
// 2,048 inputs, the 2,048 batch refilled by halves (on an H100 after 512-token prompts batch 2
// 1.7B 1,146-1,147 against 1,092-1,094 tok/s, 0.6B 2,185-2,187 against 2,097-2,114; the same
// forms at 1 row lost 2.4% / 1.0%: BENCHMARKS.md round 58, #21). Measured in the evict-first
// build (dense models' default); the plain build runs the same loops, not measured there.
#define SGEMV_1(NORM, DEFER, ARGS) sgemv_kernel<1, 2, NORM, DEFER>(ARGS)
#define SGEMV_2(NORM, DEFER, ARGS)                                                           \
  if (K == 2048) sgemv_kernel<2, 2, NORM, DEFER, 8, true>(ARGS);                             \
  else if (K == 1024) sgemv_kernel<2, 2, NORM, DEFER, 4>(ARGS);                              \
  else sgemv_kernel<2, 2, NORM, DEFER>(ARGS)
#define SGEMV(T)                                                                             \
  PLAIN_ENTRY(sgemv_silu_t##T##_bf16, SGEMV_##T(false, false, PLAIN_ARGS))                   \
  NORM_ENTRY(snorm_gemv_silu_t##T##_bf16, SGEMV_##T(true, false, NORM_ARGS))                 \
  NORM_ENTRY(sdnorm_gemv_silu_t##T##_bf16, SGEMV_##T(true, true, NORM_ARGS))

// Two batches in flight (LaunchOptions::gemv_double_buffer), plain and behind the norm, for
// rows of more than BATCH * 256 inputs.
#define GEMV_DB(T)                                                                           \
  PLAIN_ENTRY(gemv_db_t##T##_bf16, gemv_kernel<T, 1, 0, true>(PLAIN_ARGS))                   \
  NORM_ENTRY(norm_gemv_db_t##T##_bf16, gemv_kernel<T, 1, 1, true>(NORM_ARGS))

// The norm kernels with the scale deferred (LaunchOptions::norm_deferred): plain and
// double-buffered, gate|up a block per eight pairs (on streamed rows: SGEMV).
#define DNORM_GEMV(T)                                                                        \
  NORM_ENTRY(dnorm_gemv_t##T##_bf16, gemv_kernel<T, 1, 3>(NORM_ARGS))                        \
  NORM_ENTRY(dnorm_gemv_silu_t##T##_bf16, gemv_kernel<T, 2, 3>(NORM_ARGS))                   \
  NORM_ENTRY(dnorm_gemv_db_t##T##_bf16, gemv_kernel<T, 1, 3, true>(NORM_ARGS))

// Rows split in two (LaunchOptions::gemv_split_k), plain only.
#define GEMV_SPLIT(T) PLAIN_ENTRY(gemv_split_t##T##_bf16, gemv_split_kernel<T>(W, x, out, N, K))

GEMV(1)
GEMV(2)
DNORM_GEMV(1)
DNORM_GEMV(2)
SGEMV(1)
// The three forms in one function: held to 128 registers, two blocks an SM as the 1-row's.
#undef ENTRY_BOUNDS
#define ENTRY_BOUNDS __launch_bounds__(WARPS * 32, 2)
SGEMV(2)
// The 1-row streamed gate|up with its second batch staged in shared memory
// (LaunchOptions::gemv_stream_stage; `_st`). Its dynamic shared memory holds the stages, then
// the normed rows; the plain entry takes it as well. Two blocks an SM, as the 1-row's.
#define PLAIN_SMEM_ENTRY(NAME, ...)                                                          \
  extern "C" __global__ void ENTRY_BOUNDS NAME(                                              \
      const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* out, int N, int K,      \
      const void* pf, unsigned long long pf_bytes) {                                         \
    extern __shared__ __align__(16) __nv_bfloat16 x_s[];                                     \
    __VA_ARGS__;                                                                             \
  }
#define PLAIN_SMEM_ARGS W, x, nullptr, nullptr, nullptr, 0.f, 0, out, N, K, x_s, pf, pf_bytes
PLAIN_SMEM_ENTRY(sgemv_silu_st_t1_bf16,
                 sgemv_kernel<1, 2, false, false, 0, false, true>(PLAIN_SMEM_ARGS))
NORM_ENTRY(snorm_gemv_silu_st_t1_bf16, sgemv_kernel<1, 2, true, false, 0, false, true>(NORM_ARGS))
NORM_ENTRY(sdnorm_gemv_silu_st_t1_bf16, sgemv_kernel<1, 2, true, true, 0, false, true>(NORM_ARGS))
#undef ENTRY_BOUNDS
#define ENTRY_BOUNDS __launch_bounds__(WARPS * 32)
GEMV_DB(1)
GEMV_DB(2)
GEMV_SPLIT(1)
GEMV_SPLIT(2)
