// The LoRA decode path with the deltas fused into the step's norms and SiLU
// (LaunchOptions::lora_fused; steps whose tiles are one token each; launchers:
// src/engine/cuda/lora_fused_ops.rs, the slots' layout: src/engine/model/lora_slots.rs). Per
// layer the deltas take two launches besides the base's (the qkv expand and the o shrink of
// kernels/lora.cu) instead of eight:
//  * lora_norm_shrink: the add+RMSNorm in front of the qkv and gate|up matmuls, with the
//    delta of the matmul before it (o, or the previous layer's down) expanded into its input
//    first, and the shrink of the matmul after it from the normed row;
//  * lora_silu_shrink: the gate|up delta expanded, SiLU(gate) * up, and the down shrink's
//    partial sums over the block's columns (summed by the next lora_norm_shrink).
// Both round where the two-launch path rounds (the expanded output to T, then the residual sum
// to T, the normed row and the SiLU product to T). Adapter weights, norm weights and the tile
// table are written by no kernel of a step: both kernels load them before waiting on the
// kernel before them, and unroll the rank loops (RMAX: 16 or 64) so that the loads of a row go
// out together.
#include <stdint.h>
#include "common.cuh"

// Eight values of T from one (bf16) or two (f32) 16-byte loads.
template <typename T> struct Vec8;
template <> struct Vec8<__nv_bfloat16> {
  uint4 v;
  __device__ __forceinline__ void load(const __nv_bfloat16* p) {
    v = *reinterpret_cast<const uint4*>(p);
  }
  __device__ __forceinline__ void to(float* o) const { bf16x8_to_f32(v, o); }
};
template <> struct Vec8<float> {
  float4 a, b;
  __device__ __forceinline__ void load(const float* p) {
    a = reinterpret_cast<const float4*>(p)[0];
    b = reinterpret_cast<const float4*>(p)[1];
  }
  __device__ __forceinline__ void to(float* o) const {
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
    o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
  }
};

template <typename T> __device__ __forceinline__ float round_t(float x) {
  return to_f(from_f<T>(x));
}

// The slot of token `tok` in a table of one-token tiles (triples (token, count, slot)), or
// 0xffffffff for a token on no adapter (base rows have no tile; count-0 tiles are padding).
// The whole block calls it.
__device__ __forceinline__ uint32_t token_slot(const uint32_t* __restrict__ tiles, int ntiles,
                                               int tok, int slots) {
  __shared__ uint32_t found;
  if (threadIdx.x == 0) found = 0xffffffffu;
  __syncthreads();
  for (int i = threadIdx.x; i < ntiles; i += blockDim.x) {
    const uint32_t* tl = tiles + 3 * i;
    if ((int)tl[0] == tok && tl[1] > 0 && tl[2] < (uint32_t)slots) found = tl[2];
  }
  __syncthreads();
  return found;
}

// A row of r <= RMAX (a multiple of 8) values of b, all its loads issued at once.
template <typename T, int RMAX> struct RankRow {
  Vec8<T> v[RMAX / 8];
  __device__ __forceinline__ void load(const T* __restrict__ row, int r) {
#pragma unroll
    for (int c = 0; c < RMAX / 8; ++c)
      if (c * 8 < r) v[c].load(row + c * 8);
  }
  // sum_i ys[i] * row[i]
  __device__ __forceinline__ float dot(const float* ys, int r) const {
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < RMAX / 8; ++c) {
      if (c * 8 < r) {
        float bv[8];
        v[c].to(bv);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc += ys[c * 8 + i] * bv[i];
      }
    }
    return acc;
  }
};

constexpr int NS_ROWS = 16;   // rows of a each block of lora_norm_shrink takes
constexpr int NS_CHUNKS = 4;  // chunks of 8 columns a thread: K <= 4 * 256 * 8

// Grid (max(1, ceil(pr / 16)), T), 256 threads, r floats of dynamic shared memory. Token t =
// blockIdx.y on slot s (from the tiles):
//   d = bf16(delta[t] + yin[t] · bin[s]ᵀ)   (with bin: yin [T, parts, r] summed over its parts)
//   x = bf16(res[t] + d)  (add; else res[t]),   h[t] = bf16(x * rsqrt(mean(x²) + eps) * nw)
//   yout[t, j] = h[t] · a[s, j]  for the block's 16 rows j < pr (pr 0: none)
// Block 0 of the token writes res_out (with add) and h; every block norms the row itself. A
// token on no adapter takes block 0 only, without the deltas. res_out must not alias res.
// A thread takes columns tid * 8 + 2048 * chunk; chunk 0's weights come before the wait.
template <typename T, int RMAX>
__device__ void lora_norm_shrink(const T* __restrict__ res, const T* __restrict__ delta,
                                 T* __restrict__ res_out, const T* __restrict__ nw, float eps,
                                 int add, const float* __restrict__ yin, int parts,
                                 const T* __restrict__ bin, T* __restrict__ h,
                                 const T* __restrict__ a, float* __restrict__ yout, int pr,
                                 const uint32_t* __restrict__ tiles, int ntiles, int slots,
                                 int K, int r) {
  extern __shared__ float ys[];
  __shared__ float red[8][NS_ROWS];
  pdl_trigger();
  const int tok = blockIdx.y, j0 = blockIdx.x * NS_ROWS;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t s = token_slot(tiles, ntiles, tok, slots);
  const bool on = s != 0xffffffffu;
  if (!on && blockIdx.x > 0) return;  // uniform over the block
  const bool shrink = on && j0 < pr;
  const bool expand = on && add && bin != nullptr;
  const int c0 = tid * 8;
  const bool c0_in = c0 < K;
  const T* arow = a + ((size_t)s * pr + j0) * K;
  // Chunk 0's weights: the norm's, the block's rows of a, b's rows of this thread's columns.
  Vec8<T> wpre;
  if (c0_in) wpre.load(nw + c0);
  constexpr int PRE = sizeof(T) == 2 ? NS_ROWS : 1;
  Vec8<T> apre[PRE];
  if constexpr (sizeof(T) == 2) {
    if (shrink && c0_in) {
#pragma unroll
      for (int jj = 0; jj < NS_ROWS; ++jj)
        if (j0 + jj < pr) apre[jj].load(arow + (size_t)jj * K + c0);
    }
  }
  RankRow<T, RMAX> bpre[8];
  if (expand && c0_in) {
#pragma unroll
    for (int q = 0; q < 8; ++q) bpre[q].load(bin + ((size_t)s * K + c0 + q) * r, r);
  }
  pdl_wait();
  // Chunk 0 of the rows, issued before the barrier of the expand's y.
  Vec8<T> r0, d0;
  if (c0_in) {
    r0.load(res + (size_t)tok * K + c0);
    if (add) d0.load(delta + (size_t)tok * K + c0);
  }
  if (expand) {
    for (int i = tid; i < r; i += blockDim.x) {
      float v = 0.f;
      for (int p = 0; p < parts; ++p) v += yin[((size_t)tok * parts + p) * r + i];
      ys[i] = v;
    }
  }
  __syncthreads();
  float xr[NS_CHUNKS][8];
  float ss = 0.f;
#pragma unroll
  for (int ch = 0; ch < NS_CHUNKS; ++ch) {
    const int c = c0 + ch * 2048;
    if (c >= K) break;
    Vec8<T> rr = r0, dd = d0;
    if (ch > 0) {
      rr.load(res + (size_t)tok * K + c);
      if (add) dd.load(delta + (size_t)tok * K + c);
    }
    rr.to(xr[ch]);
    if (add) {
      float dv[8];
      dd.to(dv);
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        if (expand) {
          if (ch == 0) {
            dv[q] = round_t<T>(dv[q] + bpre[q].dot(ys, r));
          } else {
            RankRow<T, RMAX> b;
            b.load(bin + ((size_t)s * K + c + q) * r, r);
            dv[q] = round_t<T>(dv[q] + b.dot(ys, r));
          }
        }
        xr[ch][q] = round_t<T>(xr[ch][q] + dv[q]);
      }
    }
#pragma unroll
    for (int q = 0; q < 8; ++q) ss += xr[ch][q] * xr[ch][q];
  }
  // Block sum of the squares.
  ss = warp_sum(ss);
  if (lane == 0) red[warp][0] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int w = 0; w < 8; ++w) tot += red[w][0];
  const float inv = rsqrtf(tot / K + eps);
  __syncthreads();  // red is reused below
#pragma unroll
  for (int ch = 0; ch < NS_CHUNKS; ++ch) {
    const int c = c0 + ch * 2048;
    if (c >= K) break;
    float wv[8];
    Vec8<T> w = wpre;
    if (ch > 0) w.load(nw + c);
    w.to(wv);
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float x = xr[ch][q];
      const T hn = from_f<T>(x * inv * wv[q]);
      if (blockIdx.x == 0) {
        if (add) res_out[(size_t)tok * K + c + q] = from_f<T>(x);
        h[(size_t)tok * K + c + q] = hn;
      }
      xr[ch][q] = to_f(hn);
    }
  }
  if (!shrink) return;  // uniform over the block
  float acc[NS_ROWS];
#pragma unroll
  for (int jj = 0; jj < NS_ROWS; ++jj) acc[jj] = 0.f;
#pragma unroll
  for (int ch = 0; ch < NS_CHUNKS; ++ch) {
    const int c = c0 + ch * 2048;
    if (c >= K) break;
    Vec8<T> raw[NS_ROWS];
#pragma unroll
    for (int jj = 0; jj < NS_ROWS; ++jj) {
      if (j0 + jj < pr) {
        if (sizeof(T) == 2 && ch == 0) {
          raw[jj] = apre[sizeof(T) == 2 ? jj : 0];
        } else {
          raw[jj].load(arow + (size_t)jj * K + c);
        }
      }
    }
#pragma unroll
    for (int jj = 0; jj < NS_ROWS; ++jj) {
      if (j0 + jj < pr) {
        float av[8];
        raw[jj].to(av);
#pragma unroll
        for (int q = 0; q < 8; ++q) acc[jj] += xr[ch][q] * av[q];
      }
    }
  }
#pragma unroll
  for (int jj = 0; jj < NS_ROWS; ++jj) {
    const float v = warp_sum(acc[jj]);
    if (lane == 0) red[warp][jj] = v;
  }
  __syncthreads();
  if (tid < NS_ROWS && j0 + tid < pr) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) sum += red[w][tid];
    yout[(size_t)tok * pr + j0 + tid] = sum;
  }
}

// Grid (ceil(n / 256), T), 256 threads. Column c = blockIdx.x * 256 + tid of token t on slot s:
//   g = bf16(gu[t, c] + y[t, :r] · b[s, c]),  u = bf16(gu[t, n + c] + y[t, r:] · b[s, n + c])
//   act[t, c] = bf16(silu(g) * u)
//   yd[t, blockIdx.x, j] = sum over the block's columns of act[t, c] * a[s, j, c], j < r
// (y [T, 2r]: the gate|up shrink; b [slots, 2n, r]; a: down's [slots, r, n]). A token on no
// adapter gets the plain SiLU product and no partial sums.
template <typename T, int RMAX>
__device__ void lora_silu_shrink(const T* __restrict__ gu, const float* __restrict__ y,
                                 const T* __restrict__ b, T* __restrict__ act,
                                 const T* __restrict__ a, float* __restrict__ yd,
                                 const uint32_t* __restrict__ tiles, int ntiles, int slots, int n,
                                 int r) {
  __shared__ float red[8][RMAX];
  pdl_trigger();
  const int tok = blockIdx.y, c = blockIdx.x * 256 + threadIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t s = token_slot(tiles, ntiles, tok, slots);
  const bool on = s != 0xffffffffu, in = c < n;
  // The adapter's weights of this column: b's gate and up rows, down's a column.
  RankRow<T, RMAX> bg, bu;
  float av[RMAX];
  if (on && in) {
    bg.load(b + ((size_t)s * 2 * n + c) * r, r);
    bu.load(b + ((size_t)s * 2 * n + n + c) * r, r);
#pragma unroll
    for (int j = 0; j < RMAX; ++j)
      if (j < r) av[j] = to_f(a[((size_t)s * r + j) * n + c]);
  }
  pdl_wait();
  float g = 0.f, u = 0.f;
  if (in) {
    g = to_f(gu[(size_t)tok * 2 * n + c]);
    u = to_f(gu[(size_t)tok * 2 * n + n + c]);
    if (on) {
      const float* yt = y + (size_t)tok * 2 * r;
      g = round_t<T>(g + bg.dot(yt, r));
      u = round_t<T>(u + bu.dot(yt + r, r));
    }
  }
  const float v = round_t<T>(g / (1.f + __expf(-g)) * u);
  if (in) act[(size_t)tok * n + c] = from_f<T>(v);
  if (!on) return;  // uniform over the block
#pragma unroll
  for (int j = 0; j < RMAX; ++j) {
    if (j < r) {
      const float w = warp_sum(in ? v * av[j] : 0.f);
      if (lane == 0) red[warp][j] = w;
    }
  }
  __syncthreads();
  if (threadIdx.x < r) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) sum += red[w][threadIdx.x];
    yd[((size_t)tok * gridDim.x + blockIdx.x) * r + threadIdx.x] = sum;
  }
}

#define LORA_FUSED(T, S, RMAX)                                                                  \
  extern "C" __global__ void __launch_bounds__(256) lora_norm_shrink_r##RMAX##_##S(             \
      const T* res, const T* delta, T* res_out, const T* nw, float eps, int add,                \
      const float* yin, int parts, const T* bin, T* h, const T* a, float* yout, int pr,         \
      const uint32_t* tiles, int ntiles, int slots, int K, int r) {                             \
    lora_norm_shrink<T, RMAX>(res, delta, res_out, nw, eps, add, yin, parts, bin, h, a, yout,  \
                              pr, tiles, ntiles, slots, K, r);                                  \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256) lora_silu_shrink_r##RMAX##_##S(             \
      const T* gu, const float* y, const T* b, T* act, const T* a, float* yd,                   \
      const uint32_t* tiles, int ntiles, int slots, int n, int r) {                             \
    lora_silu_shrink<T, RMAX>(gu, y, b, act, a, yd, tiles, ntiles, slots, n, r);                \
  }

// Ranks up to 16 (the common adapters: every load of a row in registers before the wait) and
// up to 64.
LORA_FUSED(__nv_bfloat16, bf16, 16)
LORA_FUSED(__nv_bfloat16, bf16, 64)
LORA_FUSED(float, f32, 16)
LORA_FUSED(float, f32, 64)
