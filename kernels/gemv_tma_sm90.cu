// The 1-row skinny matmuls with their weights streamed into shared memory by the copy engine
// (LaunchOptions::gemv_tma, gemv_tma_norm, gemv_tma_norm_silu; sm_90): one block per SM, 8
// compute warps and a copy warp. Compute warp w of the grid's NW takes output rows w, w + NW,
// ... (a gate/up pair each with SiLU: gate row r and up row N + r); lane w of the copy warp
// copies that warp's rows, in pieces of 1,024 inputs (2 KB, cp.async.bulk, evict-first in L2;
// a pair's gate piece then its up piece), into a ring of `ns` slots (a full and an empty
// mbarrier a slot), starting before the wait on the kernel before (weights only; PDL). The
// warp sums each row as gemv.cuh's dot_rows does (lane l takes chunks l, l + 32, ... in
// order, then the warp's butterfly), behind the fused add+RMSNorm as gemv.cu's norm kernels
// compute it (norm_rows, or norm_rows_deferred with the scale on the sums; the block's 256
// compute threads, the same partial sums in the same order): the same bits as the skinny
// matmuls of gemv.cu. K is a multiple of 1,024 (at most 4,096 behind a norm).
//
//  * gemv_tma:                       out = x W^T
//  * gemv_tma_norm / _dnorm:         out = rmsnorm(res + delta) W^T (scale first / deferred)
//  * gemv_tma_norm_silu / _dnorm_silu: out = silu(h gate^T) * (h up^T), h the normed row

#include "gemv.cuh"

namespace {

constexpr int ST = WARPS * 32;  // compute threads a block
constexpr int PIECE = 1024;     // inputs a weight piece (4 chunks a lane)
constexpr int PIECE_BYTES = PIECE * 2;
constexpr int MAX_NS = 10;  // ring slots a warp at most

__device__ __forceinline__ uint32_t saddr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// Whether the mbarrier's phase of this parity has completed; `wait`: the potentially
// blocking try_wait, else the non-blocking test_wait.
template <bool WAIT>
__device__ __forceinline__ bool mbar_done(uint64_t* b, uint32_t parity) {
  uint32_t ok;
  if (WAIT)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(ok)
        : "r"(saddr(b)), "r"(parity)
        : "memory");
  else
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(ok)
        : "r"(saddr(b)), "r"(parity)
        : "memory");
  return ok != 0;
}

// Lane w (< 8) of the copy warp: compute warp gw's pieces in order (a pair's gate piece, then
// its up piece at row N + r), each once its slot's previous piece is summed. The eight lanes
// poll without blocking and stay converged.
template <int NR>
__device__ void produce(const __nv_bfloat16* W, int N, int K, __nv_bfloat16* slots,
                        uint64_t* full, uint64_t* empty, int ns, int gw, int NW) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  const int P = K / PIECE;
  const int total = gw < N ? ((N - 1 - gw) / NW + 1) * P * NR : 0;
  int issued = 0;
  while (__any_sync(0xffu, issued < total)) {
    if (issued >= total) continue;
    const int s = issued % ns;
    if (issued >= ns && !mbar_done<false>(empty + s, (uint32_t)(issued / ns - 1) & 1u)) continue;
    const int q = issued / NR, r = issued % NR;  // piece q of the warp's rows, of row r
    const int row = gw + (q / P) * NW + r * N;
    const __nv_bfloat16* src = W + (size_t)row * K + (size_t)(q % P) * PIECE;
    const uint32_t bar = saddr(full + s);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                 "r"(PIECE_BYTES)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1], %2, [%3], %4;" ::"r"(saddr(slots + (size_t)s * PIECE)),
        "l"(src), "r"(PIECE_BYTES), "r"(bar), "l"(policy)
        : "memory");
    ++issued;
  }
}

constexpr int NW_MAX = 16;  // norm weights a compute thread holds (K <= 4,096)

// 1 / rms from each compute thread's partial sum of squares: gemv.cuh's block_inv_rms<1> on
// the 256 compute threads (a named barrier: the copy warp does not take part).
__device__ __forceinline__ float compute_inv_rms(float part, int K, float eps) {
  __shared__ float ss[WARPS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float s = warp_sum(part);
  if (lane == 0) ss[warp] = s;
  asm volatile("bar.sync 1, %0;" ::"r"(ST) : "memory");
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < WARPS; ++i) tot += ss[i];
  return rsqrtf(tot / K + eps);
}

// The normed input row into x_s, as gemv.cuh's norm_rows<1> (NORM 1: scale first, a second
// pass) or norm_rows_deferred<1> (NORM 3: x_s = bf16(sum * w), the scale returned for the
// sums), by the compute threads; wk holds the norm weights (wk[e] = w[tid + 256 e]). Block 0
// writes the residual sum to res_out when add. Ends behind a compute barrier.
template <int NORM>
__device__ __forceinline__ float norm_into(const __nv_bfloat16* res, const __nv_bfloat16* delta,
                                           __nv_bfloat16* res_out,
                                           const __nv_bfloat16 (&wk)[NW_MAX], float eps, int add,
                                           int K, __nv_bfloat16* x_s) {
  float part = 0.f;
#pragma unroll
  for (int e = 0; e < NW_MAX; ++e) {
    const int k = threadIdx.x + e * ST;
    if (k < K) {
      float v = __bfloat162float(res[k]);
      if (NORM == 3) {
        if (add) {
          const __nv_bfloat16 s = __float2bfloat16(v + __bfloat162float(delta[k]));
          if (blockIdx.x == 0) res_out[k] = s;
          v = __bfloat162float(s);
        }
        x_s[k] = __float2bfloat16(v * __bfloat162float(wk[e]));
      } else {
        if (add) v = __bfloat162float(__float2bfloat16(v + __bfloat162float(delta[k])));
        x_s[k] = __float2bfloat16(v);
      }
      part += v * v;
    }
  }
  const float inv = compute_inv_rms(part, K, eps);
  if (NORM == 1) {
#pragma unroll
    for (int e = 0; e < NW_MAX; ++e) {
      const int k = threadIdx.x + e * ST;
      if (k < K) {
        const __nv_bfloat16 r = x_s[k];
        if (add && blockIdx.x == 0) res_out[k] = r;
        x_s[k] = __float2bfloat16(__bfloat162float(r) * inv * __bfloat162float(wk[e]));
      }
    }
    asm volatile("bar.sync 1, %0;" ::"r"(ST) : "memory");
  }
  return inv;
}

// NR 1: out[row] = W[row] . x; NR 2: out[row] = silu(W[row] . x) * (W[N + row] . x). NORM 0:
// x as given; 1, 3: x = rmsnorm(res + delta) * nw (x is res), scale first or deferred.
template <int NR, int NORM>
__device__ void tma_gemv(const __nv_bfloat16* __restrict__ W, const __nv_bfloat16* x,
                         const __nv_bfloat16* delta, __nv_bfloat16* res_out,
                         const __nv_bfloat16* __restrict__ nw, float eps, int add,
                         __nv_bfloat16* out, int N, int K, int ns) {
  extern __shared__ __align__(128) __nv_bfloat16 dyn[];
  __shared__ __align__(8) uint64_t full[WARPS][MAX_NS], empty[WARPS][MAX_NS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int NW = gridDim.x * WARPS, gw = blockIdx.x * WARPS + warp;
  __nv_bfloat16* x_s = dyn + (size_t)WARPS * ns * PIECE;
  pdl_trigger();
  if (warp == WARPS) {
    if (lane < WARPS)
      for (int s = 0; s < ns; ++s) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[lane][s])) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&empty[lane][s])) : "memory");
      }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    if (lane < WARPS)
      produce<NR>(W, N, K, dyn + (size_t)lane * ns * PIECE, full[lane], empty[lane], ns,
                  blockIdx.x * WARPS + lane, NW);
    return;
  }
  __nv_bfloat16 wk[NW_MAX];
  if (NORM != 0) {
#pragma unroll
    for (int e = 0; e < NW_MAX; ++e) {
      const int k = threadIdx.x + e * ST;
      wk[e] = k < K ? nw[k] : __float2bfloat16(0.f);
    }
  }
  __syncthreads();  // the mbarriers are initialised
  pdl_wait();
  float inv = 1.f;
  if (NORM == 0) {
    for (int i = threadIdx.x; i < K / 8; i += ST)
      reinterpret_cast<uint4*>(x_s)[i] = reinterpret_cast<const uint4*>(x)[i];
    asm volatile("bar.sync 1, %0;" ::"r"(ST) : "memory");
  } else {
    inv = norm_into<NORM>(x, delta, res_out, wk, eps, add, K, x_s);
  }
  const int P = K / PIECE;
  __nv_bfloat16* slots = dyn + (size_t)warp * ns * PIECE;
  int used = 0;
  for (int row = gw; row < N; row += NW) {
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = 0.f;
    for (int pc = 0; pc < P; ++pc, used += NR) {
      const __nv_bfloat16* w[NR];
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const int s = (used + r) % ns;
        while (!mbar_done<true>(&full[warp][s], (uint32_t)((used + r) / ns) & 1u)) {
        }
        w[r] = slots + (size_t)s * PIECE;
      }
#pragma unroll
      for (int i = 0; i < PIECE / 256; ++i) {
        const int c = lane + 32 * i;
        float wf[NR][8], xf[8];
#pragma unroll
        for (int r = 0; r < NR; ++r) bf16x8_to_f32(reinterpret_cast<const uint4*>(w[r])[c], wf[r]);
        bf16x8_to_f32(reinterpret_cast<const uint4*>(x_s)[pc * (PIECE / 8) + c], xf);
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r] = fmaf(wf[r][j], xf[j], acc[r]);
      }
      __syncwarp();
      if (lane == 0)
#pragma unroll
        for (int r = 0; r < NR; ++r)
          asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&empty[warp][(used + r) % ns]))
                       : "memory");
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      acc[r] = warp_sum(acc[r]);
      if (NORM == 3) acc[r] *= inv;
    }
    float v = acc[0];
    if (NR == 2) v = v / (1.f + __expf(-v)) * acc[NR - 1];
    if (lane == 0) out[row] = __float2bfloat16(v);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(WARPS * 32 + 32, 1)
    gemv_tma(const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* out, int N, int K,
             int ns) {
  tma_gemv<1, 0>(W, x, nullptr, nullptr, nullptr, 0.f, 0, out, N, K, ns);
}

// The kernels behind the fused add+RMSNorm: res (1 x K), delta (when add), res_out (written by
// block 0 when add), the norm weights nw and eps; N is I (the pairs) for the SiLU kernels.
#define TMA_NORM_ENTRY(NAME, NR, NORM)                                                       \
  extern "C" __global__ void __launch_bounds__(WARPS * 32 + 32, 1) NAME(                     \
      const __nv_bfloat16* W, const __nv_bfloat16* res, const __nv_bfloat16* delta,          \
      __nv_bfloat16* res_out, const __nv_bfloat16* nw, float eps, int add,                   \
      __nv_bfloat16* out, int N, int K, int ns) {                                            \
    tma_gemv<NR, NORM>(W, res, delta, res_out, nw, eps, add, out, N, K, ns);                 \
  }
TMA_NORM_ENTRY(gemv_tma_norm, 1, 1)
TMA_NORM_ENTRY(gemv_tma_dnorm, 1, 3)
TMA_NORM_ENTRY(gemv_tma_norm_silu, 2, 1)
TMA_NORM_ENTRY(gemv_tma_dnorm_silu, 2, 3)
