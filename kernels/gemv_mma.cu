// Skinny matmuls of decode steps of 3..8 token rows on tensor cores (LaunchOptions::gemv_mma;
// the 1-2-row kernels and their helpers: gemv.cu, gemv.cuh): plain, SiLU*up, and both behind
// the block-wide fused norm, with gemv.cu's arguments. Where CUDA-core FMAs would bound the
// step (8 rows x 8 products per 16 weight bytes).

#include "gemv.cuh"

namespace {

// ---- Tensor cores for 3..8 token rows -------------------------------------------------------
//
// out^T [N, T] = W [N, K] x^T [K, T] as mma.sync m16n8k16 (bf16 in, f32 accumulate): a block
// takes 16 output rows (16 gate and the 16 matching up rows for SiLU), its 8 warps split K in
// steps of 32 (warp w takes steps w, w + 8, ...), and the block sums the warps' tiles in shared
// memory. Lane (g = lane / 4, c = lane % 4) loads 16 bytes of W rows g and g + 8 and of token row
// g of x, all at k = 32 s + 8 c: k values 8c..8c+3 fill the fragment slots (2c, 2c+1, 2c+8,
// 2c+9) of the step's first MMA and 8c+4..8c+7 those of its second, in A and B alike, so each
// MMA sums 16 distinct k of the step: the dot product in another order. Token rows past T are
// zeros. K must be a multiple of 32.
//
// The presummed norm (LaunchOptions::norm_presum; PS): a plain matmul whose output is a
// residual delta (o, down) adds it to the residual itself (PS 1: res_out = bf16(res +
// bf16(out)), as add_rmsnorm adds; the residual's values loaded right after the wait, used
// after the loop) and writes its 16 columns' sums of squares of the sum per token row
// (ss[block][t], 8 floats a block), so the matmul after the norm (qkv, gate|up; PS 2) needs
// no norm launch: it multiplies its input rows by the norm weight as it loads them, bf16(h *
// w), and its finished dot products by 1 / rms (the deferred norm's rounding), which warp t
// sums from the partials (loaded right after the wait, summed after the loop: the same
// order in every block).
struct Presum {
  const __nv_bfloat16* res;  // PS 1: the residual the delta is added to
  __nv_bfloat16* res_out;    // PS 1: the sum
  float* ss;                 // PS 1: written; PS 2: read ([nparts][8])
  const __nv_bfloat16* nw;   // PS 2: the norm's weight [K]
  float eps;                 // PS 2
  int nparts;                // PS 2: partials a row
};

// Most partial sums a row of the presummed norm reads (a lane's 8: 4,096 columns).
constexpr int PS_PARTS = 256;

// bf16(h * w) of eight inputs (one 16-byte load of h and of w), packed.
__device__ __forceinline__ uint4 mul8(uint4 h, uint4 w) {
  float hf[8], wf[8];
  bf16x8_to_f32(h, hf);
  bf16x8_to_f32(w, wf);
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 v =
        __floats2bfloat162_rn(hf[2 * i] * wf[2 * i], hf[2 * i + 1] * wf[2 * i + 1]);
    o[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// Built with MMA_X_STAGE (build.rs gemv_mma_ef_xs, LaunchOptions::gemv_mma_x_stage) a kernel
// without the block-wide norm copies each batch's input chunks (and, PS 2, the norm weight's)
// into its warp's part of a stage in shared memory by cp.async, one round of copies a batch,
// and its loop reads them there: where the loop loaded step i's chunk behind step i - 1's
// MMAs and branch. A lane reads back only the x chunk it copied; the norm weight's chunks of
// a step, copied by lanes 0..3, are read by every lane after the warp's sync. Same values.
#ifdef MMA_X_STAGE
constexpr bool X_STAGE = true;
#else
constexpr bool X_STAGE = false;
#endif

// A 16-byte copy from global into shared memory by cp.async (L2 only), in commit groups the
// caller closes.
template <typename E>
__device__ __forceinline__ void cp_async_x16(void* dst, const E* src) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}

template <int T, bool SILU, bool NORM, int PS = 0>
__device__ __forceinline__ void mma_gemv_kernel(const __nv_bfloat16* __restrict__ W,
                                                const __nv_bfloat16* x,
                                                const __nv_bfloat16* __restrict__ delta,
                                                __nv_bfloat16* __restrict__ res_out,
                                                const __nv_bfloat16* __restrict__ nw, float eps,
                                                int add, __nv_bfloat16* __restrict__ out, int N,
                                                int K, __nv_bfloat16* x_s, const void* pf,
                                                unsigned long long pf_bytes,
                                                const Presum ps = Presum{}) {
  constexpr int P = SILU ? 2 : 1;   // gate (and up) tiles
  constexpr int B = SILU ? 4 : 8;   // steps a warp keeps in flight
  __shared__ float red[WARPS][P][16][8];
  pdl_trigger();
  l2_prefetch_share(pf, pf_bytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int row0 = blockIdx.x * 16;
  const int steps = K / 32;
  const __nv_bfloat16* wr[P][2];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    wr[p][0] = W + (size_t)(min(row0 + g, N - 1) + p * N) * K + 8 * c;
    wr[p][1] = W + (size_t)(min(row0 + g + 8, N - 1) + p * N) * K + 8 * c;
  }
  uint4 wv[P][2][B];
  // MMA_X_STAGE: the warp's input chunks of a batch (step i, token row g, 32 inputs) and,
  // PS 2, the norm weight's (step i, 32 inputs).
  constexpr bool XS = X_STAGE && !NORM;
  constexpr int XW = XS ? WARPS : 1, XB = XS ? B : 1, NWW = XS && PS == 2 ? WARPS : 1;
  __shared__ __align__(16) __nv_bfloat16 xst[XW][XB][8][32];
  __shared__ __align__(16) __nv_bfloat16 nwst[NWW][XB][32];
  auto stage_nw = [&](int s0) {
    if constexpr (XS && PS == 2) {
      __syncwarp();  // every lane has read the batch before
      if (g == 0) {
#pragma unroll
        for (int i = 0; i < B; ++i) {
          const int s = s0 + WARPS * i;
          if (s < steps) cp_async_x16(&nwst[warp][i][8 * c], ps.nw + s * 32 + 8 * c);
        }
      }
    }
  };
  auto stage_x = [&](int s0) {
    if constexpr (XS) {
      if (g < T) {
#pragma unroll
        for (int i = 0; i < B; ++i) {
          const int s = s0 + WARPS * i;
          if (s < steps)
            cp_async_x16(&xst[warp][i][g][8 * c], x + (size_t)g * K + s * 32 + 8 * c);
        }
      }
      asm volatile("cp.async.commit_group;\n" ::: "memory");
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      if constexpr (PS == 2) __syncwarp();
    }
  };
  auto load = [&](int s0) {
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int s = s0 + WARPS * i;
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          wv[p][h][i] = s < steps ? ld_stream(wr[p][h] + (size_t)s * 32) : make_uint4(0, 0, 0, 0);
    }
  };
  load(warp);
  if constexpr (XS) stage_nw(warp);
  pdl_wait();
  if constexpr (XS) stage_x(warp);
  if (NORM) {
    norm_rows<T>(x, delta, res_out, nw, eps, add, K, x_s);
    x = x_s;
  }
  // PS 2: warp t's lanes hold row t's partial sums of squares (p = lane + 32 j); PS 1: threads
  // 0..127 the residual value of the column and row they store.
  float ssv[PS_PARTS / 32];
  float resv = 0.f;
  if constexpr (PS == 2) {
#pragma unroll
    for (int j = 0; j < PS_PARTS / 32; ++j) {
      const int p = lane + 32 * j;
      ssv[j] = warp < T && p < ps.nparts ? ps.ss[p * 8 + warp] : 0.f;
    }
  }
  if constexpr (PS == 1) {
    const int r = threadIdx.x / 8, t = threadIdx.x % 8;
    if (threadIdx.x < 16 * 8 && t < T && row0 + r < N)
      resv = __bfloat162float(ps.res[(size_t)t * N + row0 + r]);
  }
  float d[P][4];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int j = 0; j < 4; ++j) d[p][j] = 0.f;
  for (int s0 = warp; s0 < steps; s0 += WARPS * B) {
    if (s0 != warp) load(s0);
    if constexpr (XS) {
      if (s0 != warp) {
        stage_nw(s0);
        stage_x(s0);
      }
    }
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int s = s0 + WARPS * i;
      if (s >= steps) break;
      const __nv_bfloat16* xp = x + (size_t)g * K + s * 32 + 8 * c;
      const __nv_bfloat16* np = ps.nw + s * 32 + 8 * c;
      if constexpr (XS) {
        xp = &xst[warp][i][g][8 * c];
        np = &nwst[warp][i][8 * c];
      }
      uint4 xv = g < T ? *reinterpret_cast<const uint4*>(xp) : make_uint4(0, 0, 0, 0);
      if constexpr (PS == 2) {
        if (g < T) xv = mul8(xv, *reinterpret_cast<const uint4*>(np));
      }
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const uint4 lo = wv[p][0][i], hi = wv[p][1][i];
        mma_bf16(d[p], lo.x, hi.x, lo.y, hi.y, xv.x, xv.y);
        mma_bf16(d[p], lo.z, hi.z, lo.w, hi.w, xv.z, xv.w);
      }
    }
  }
  __shared__ float inv_s[8];  // PS 2: 1 / rms of each token row
  if constexpr (PS == 2) {
    if (warp < T) {
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < PS_PARTS / 32; ++j) sum += ssv[j];
      sum = warp_sum(sum);
      if (lane == 0) inv_s[warp] = rsqrtf(sum / K + ps.eps);
    }
  }
  // d[p] = rows g (j 0, 1) and g + 8 (j 2, 3) at tokens 2c, 2c + 1.
#pragma unroll
  for (int p = 0; p < P; ++p) {
    red[warp][p][g][2 * c] = d[p][0];
    red[warp][p][g][2 * c + 1] = d[p][1];
    red[warp][p][g + 8][2 * c] = d[p][2];
    red[warp][p][g + 8][2 * c + 1] = d[p][3];
  }
  __syncthreads();
  float sq = 0.f;  // PS 1: this thread's column's square of the sum
  if (threadIdx.x < 16 * 8) {
    const int r = threadIdx.x / 8, t = threadIdx.x % 8;
    if (t < T && row0 + r < N) {
      float v[P];
#pragma unroll
      for (int p = 0; p < P; ++p) {
        v[p] = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) v[p] += red[w][p][r][t];
        if constexpr (PS == 2) v[p] *= inv_s[t];
      }
      float o = v[0];
      if (SILU) o = o / (1.f + __expf(-o)) * v[P - 1];
      const size_t i = (size_t)t * N + row0 + r;
      const __nv_bfloat16 ob = __float2bfloat16(o);
      out[i] = ob;
      if constexpr (PS == 1) {
        const __nv_bfloat16 sum = __float2bfloat16(resv + __bfloat162float(ob));
        ps.res_out[i] = sum;
        const float f = __bfloat162float(sum);
        sq = f * f;
      }
    }
  }
  if constexpr (PS == 1) {
    // Threads 0..127 hold column r = threadIdx.x / 8 of token row t = threadIdx.x % 8: the
    // four columns of a warp's lanes with one t (lanes t, t + 8, t + 16, t + 24), then the
    // four warps, in one order.
    __shared__ float ssw[4][8];
    sq += __shfl_xor_sync(0xffffffffu, sq, 8);
    sq += __shfl_xor_sync(0xffffffffu, sq, 16);
    if (warp < 4 && lane < 8) ssw[warp][lane] = sq;
    __syncthreads();
    if (threadIdx.x < 8)
      ps.ss[blockIdx.x * 8 + threadIdx.x] =
          ssw[0][threadIdx.x] + ssw[1][threadIdx.x] + ssw[2][threadIdx.x] + ssw[3][threadIdx.x];
  }
}

}  // namespace

// Tensor cores, 3..8 rows: plain, SiLU*up, and both behind the norm.
#define MMA_GEMV(T)                                                                          \
  PLAIN_ENTRY(mma_gemv_t##T##_bf16, mma_gemv_kernel<T, false, false>(PLAIN_ARGS))            \
  PLAIN_ENTRY(mma_gemv_silu_t##T##_bf16, mma_gemv_kernel<T, true, false>(PLAIN_ARGS))        \
  NORM_ENTRY(mma_norm_gemv_t##T##_bf16, mma_gemv_kernel<T, false, true>(NORM_ARGS))          \
  NORM_ENTRY(mma_norm_gemv_silu_t##T##_bf16, mma_gemv_kernel<T, true, true>(NORM_ARGS))

// The presummed norm (PS 1 and 2 above): a plain matmul that adds its output to the residual
// and writes its sums of squares; plain and SiLU*up behind the presummed norm.
#define PRESUM_PRE(T, NAME, SILU)                                                            \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) NAME(                             \
      const __nv_bfloat16* W, const __nv_bfloat16* h, __nv_bfloat16* out, int N, int K,      \
      const __nv_bfloat16* nw, float eps, const float* ss, int nparts) {                     \
    mma_gemv_kernel<T, SILU, false, 2>(W, h, nullptr, nullptr, nullptr, 0.f, 0, out, N, K,   \
                                       nullptr, nullptr, 0,                                  \
                                       Presum{nullptr, nullptr, const_cast<float*>(ss), nw,  \
                                              eps, nparts});                                 \
  }
#define MMA_PRESUM(T)                                                                        \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) mma_gemv_res_t##T##_bf16(          \
      const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* out, int N, int K,      \
      const __nv_bfloat16* res, __nv_bfloat16* res_out, float* ss) {                         \
    mma_gemv_kernel<T, false, false, 1>(W, x, nullptr, nullptr, nullptr, 0.f, 0, out, N, K,  \
                                        nullptr, nullptr, 0,                                 \
                                        Presum{res, res_out, ss, nullptr, 0.f, 0});          \
  }                                                                                          \
  PRESUM_PRE(T, mma_gemv_pre_t##T##_bf16, false)                                             \
  PRESUM_PRE(T, mma_gemv_pre_silu_t##T##_bf16, true)

MMA_PRESUM(3)
MMA_PRESUM(4)
MMA_PRESUM(5)
MMA_PRESUM(6)
MMA_PRESUM(7)
MMA_PRESUM(8)

MMA_GEMV(3)
MMA_GEMV(4)
MMA_GEMV(5)
MMA_GEMV(6)
MMA_GEMV(7)
MMA_GEMV(8)
