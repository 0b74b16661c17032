// LoRA deltas added to a fused matmul's output (src/engine/model/lora_slots.rs has the
// layout; launchers: src/engine/cuda/lora_ops.rs). Per layer and fused matmul of P
// projections: a = [slots, P * R, in], b = [slots, out, R]. The tokens on adapters come as
// tiles: (first token, count <= TM, slot), tokens of a tile consecutive and on one slot, so
// each block reads its rows of a and b once for up to tm tokens. A tile with count 0 (the
// unused tail of a graph's table) or a slot >= slots does nothing. The tile table and the
// adapter rows are written by no kernel of a step, so both kernels read them before waiting on
// the kernel before them (programmatic dependent launch, common.cuh).
#include <stdint.h>
#include "common.cuh"

// Shrink: y[t, j] = sum_k x[t, k] * a[slot, j, k] (f32) for the tokens t of a tile, j < pr.
// Tiles of one token (TM 1): grid (pr, tiles), 256 threads: the block splits row j of a over
// its threads (eight values a thread a step, so a row of 1-6k inputs takes each thread 1-3
// independent loads; small steps are latency-bound) and the warps' sums meet in shared
// memory. Wider tiles (TM 8): grid (ceil(pr / 8), tiles), warp w of block (bx, tile) takes
// row j = bx * 8 + w for every token of the tile, so the tile's rows of x are read by 8 warps
// and not by a block per row of a (large batches are bound by those reads).
template <typename T, int TM>
__device__ __forceinline__ void lora_shrink(const T* __restrict__ x, const T* __restrict__ a,
                                            const uint32_t* __restrict__ tiles,
                                            float* __restrict__ y, int in, int pr, int slots) {
  constexpr bool BLOCK_ROW = TM == 1;  // a block per row of a
  // The tile table (uploaded before the step) and the adapter rows (uploaded when an adapter
  // takes its slot) are written by no kernel of the step: the block reads its tile and its
  // first chunks of a before waiting on the kernel before it (common.cuh), so their latency
  // overlaps that kernel; x is read after the wait.
  pdl_trigger();
  __shared__ float part[8][TM];
  const uint32_t* tl = tiles + 3 * blockIdx.y;
  const int t0 = tl[0], n = tl[1];
  const uint32_t s = tl[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int j = BLOCK_ROW ? blockIdx.x : blockIdx.x * 8 + warp;
  if (n == 0 || s >= (uint32_t)slots) return;  // uniform over the block
  if (!BLOCK_ROW && j >= pr) return;           // uniform over the warp; no block barrier follows
  const T* ar = a + ((size_t)s * pr + j) * in;
  // A block per row: the block's threads stride the row; a warp per row: its lanes do.
  const int first = BLOCK_ROW ? threadIdx.x : lane;
  const int stride = BLOCK_ROW ? 256 : 32;
  float acc[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) acc[c] = 0.f;
  if constexpr (sizeof(T) == 2) {
    // Eight bf16 a load (in is a multiple of 8: the launcher checks); the first PRE loads of
    // the row before the wait.
    constexpr int PRE = 4;
    uint4 pre[PRE];
#pragma unroll
    for (int i = 0; i < PRE; ++i) {
      const int k = (first + i * stride) * 8;
      if (k < in) pre[i] = *reinterpret_cast<const uint4*>(ar + k);
    }
    pdl_wait();
    int i = 0;
    for (int k = first * 8; k < in; k += stride * 8, ++i) {
      float av[8];
      uint4 raw;
      if (i < PRE) {
#pragma unroll
        for (int q = 0; q < PRE; ++q)
          if (q == i) raw = pre[q];
      } else {
        raw = *reinterpret_cast<const uint4*>(ar + k);
      }
      bf16x8_to_f32(raw, av);
#pragma unroll
      for (int c = 0; c < TM; ++c) {
        if (c < n) {
          float xv[8];
          bf16x8_to_f32(*reinterpret_cast<const uint4*>(x + (size_t)(t0 + c) * in + k), xv);
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[c] += xv[q] * av[q];
        }
      }
    }
  } else {
    pdl_wait();
    for (int k = first; k < in; k += stride) {
      const float av = to_f(ar[k]);
#pragma unroll
      for (int c = 0; c < TM; ++c)
        if (c < n) acc[c] += to_f(x[(size_t)(t0 + c) * in + k]) * av;
    }
  }
  if constexpr (BLOCK_ROW) {
    const float v = warp_sum(acc[0]);
    if (lane == 0) part[warp][0] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) sum += part[w][0];
      y[(size_t)t0 * pr + j] = sum;
    }
  } else {
#pragma unroll
    for (int c = 0; c < TM; ++c) {
      if (c < n) {
        const float v = warp_sum(acc[c]);
        if (lane == 0) y[(size_t)(t0 + c) * pr + j] = v;
      }
    }
  }
}

// Expand: out[t, o] += sum_r y[t, p * R + r] * b[slot, o, r] for the tokens t of a tile, p =
// (o >= s1) + (o >= s2) the projection output row o belongs to. Grid (ceil(nout / 256),
// tiles), 256 threads, TM * pr floats of shared memory. R is a multiple of 8 (the slots pad
// it): a thread reads its row of b eight values a load.
template <typename T, int TM>
__device__ __forceinline__ void lora_expand(const float* __restrict__ y, const T* __restrict__ b,
                                            const uint32_t* __restrict__ tiles,
                                            T* __restrict__ out, int nout, int r, int pr, int s1,
                                            int s2, int slots) {
  // As the shrink: the tile and the first chunks of this thread's row of b before the wait;
  // y and out after it.
  pdl_trigger();
  extern __shared__ float ys[];
  const uint32_t* tl = tiles + 3 * blockIdx.y;
  const int t0 = tl[0], n = tl[1];
  const uint32_t s = tl[2];
  if (n == 0 || s >= (uint32_t)slots) return;  // uniform over the block
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  const T* br = b + ((size_t)s * nout + min(o, nout - 1)) * r;
  constexpr int PRE = 4;  // ranks up to 32 (bf16) come whole before the wait
  uint4 pre[PRE];
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int i = 0; i < PRE; ++i)
      if (o < nout && i * 8 < r) pre[i] = *reinterpret_cast<const uint4*>(br + i * 8);
  }
  pdl_wait();
  for (int i = threadIdx.x; i < n * pr; i += blockDim.x) ys[i] = y[(size_t)t0 * pr + i];
  __syncthreads();
  if (o >= nout) return;
  const int p = (o >= s1) + (o >= s2);
  float acc[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) acc[c] = 0.f;
  for (int i0 = 0; i0 < r; i0 += 8) {
    float bv[8];
    if constexpr (sizeof(T) == 2) {
      uint4 raw;
      if (i0 < PRE * 8) {
#pragma unroll
        for (int q = 0; q < PRE; ++q)
          if (q * 8 == i0) raw = pre[q];
      } else {
        raw = *reinterpret_cast<const uint4*>(br + i0);
      }
      bf16x8_to_f32(raw, bv);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) bv[i] = to_f(br[i0 + i]);
    }
#pragma unroll
    for (int c = 0; c < TM; ++c) {
      if (c < n) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[c] += ys[c * pr + p * r + i0 + i] * bv[i];
      }
    }
  }
#pragma unroll
  for (int c = 0; c < TM; ++c) {
    if (c < n) {
      T* dst = out + (size_t)(t0 + c) * nout + o;
      *dst = from_f<T>(to_f(*dst) + acc[c]);
    }
  }
}

#define LORA_KERNELS(T, S, TM)                                                                  \
  extern "C" __global__ void lora_shrink_t##TM##_##S(const T* x, const T* a,                    \
                                                    const uint32_t* tiles, float* y, int in,    \
                                                    int pr, int slots) {                        \
    lora_shrink<T, TM>(x, a, tiles, y, in, pr, slots);                                          \
  }                                                                                             \
  extern "C" __global__ void lora_expand_t##TM##_##S(const float* y, const T* b,                \
                                                    const uint32_t* tiles, T* out, int nout,    \
                                                    int r, int pr, int s1, int s2, int slots) { \
    lora_expand<T, TM>(y, b, tiles, out, nout, r, pr, s1, s2, slots);                           \
  }

// Tiles of one token (small decode steps: one warp per row of a, latency-bound) and of up to
// eight (large batches and prefill: each block reads its adapter rows once per tile).
LORA_KERNELS(__nv_bfloat16, bf16, 1)
LORA_KERNELS(__nv_bfloat16, bf16, 8)
LORA_KERNELS(float, f32, 1)
LORA_KERNELS(float, f32, 8)

// ---------------------------------------------------------------------------------------------
// The decode path with the deltas fused into the step's norms and SiLU
// (LaunchOptions::lora_fused; steps whose tiles are one token each). Per layer the deltas take
// two launches besides the base's (the qkv expand, the o shrink) instead of eight:
//  * lora_norm_shrink: the add+RMSNorm in front of the qkv and gate|up matmuls, with the
//    delta of the matmul before it (o, or the previous layer's down) expanded into its input
//    first, and the shrink of the matmul after it from the normed row;
//  * lora_silu_shrink: the gate|up delta expanded, SiLU(gate) * up, and the down shrink's
//    partial sums over the block's columns (summed by the next lora_norm_shrink).
// Both round where the two-launch path rounds (the expanded output to T, then the residual sum
// to T, the normed row and the SiLU product to T).

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
// The whole block calls it; the table is written by no kernel of the step.
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

// sum_i ys[i] * row[i] over a row of r (a multiple of 8) values of b.
template <typename T>
__device__ __forceinline__ float dot_rank(const float* ys, const T* __restrict__ row, int r) {
  float acc = 0.f;
  for (int i0 = 0; i0 < r; i0 += 8) {
    Vec8<T> raw;
    raw.load(row + i0);
    float bv[8];
    raw.to(bv);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc += ys[i0 + i] * bv[i];
  }
  return acc;
}

constexpr int NS_ROWS = 16;   // rows of a each block of lora_norm_shrink takes
constexpr int NS_CHUNKS = 4;  // chunks of 8 columns a thread: K <= 4 * 256 * 8

// Grid (max(1, ceil(pr / 16)), T), 256 threads, r floats of dynamic shared memory. Token t =
// blockIdx.y on slot s (from the tiles):
//   d = bf16(delta[t] + yin[t] · bin[s]ᵀ)   (with bin: yin [T, parts, r] summed over its parts)
//   x = bf16(res[t] + d)  (add; else res[t]),   h[t] = bf16(x * rsqrt(mean(x²) + eps) * nw)
//   yout[t, j] = h[t] · a[s, j]  for the block's 16 rows j < pr (pr 0: none)
// Block 0 of the token writes res_out (with add) and h; every block norms the row itself. A
// token on no adapter takes block 0 only, without the deltas. res_out must not alias res.
template <typename T>
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
  const T* arow = a + ((size_t)s * pr + j0) * K;
  // The block's rows of a (adapter weights: no kernel of the step writes them), the first
  // chunk before the wait (bf16).
  constexpr int PRE = sizeof(T) == 2 ? NS_ROWS : 1;
  Vec8<T> pre[PRE];
  const int c0 = tid * 8;
  if constexpr (sizeof(T) == 2) {
    if (shrink && c0 < K) {
#pragma unroll
      for (int jj = 0; jj < NS_ROWS; ++jj)
        if (j0 + jj < pr) pre[jj].load(arow + (size_t)jj * K + c0);
    }
  }
  pdl_wait();
  const bool expand = on && add && bin != nullptr;
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
    Vec8<T> raw;
    raw.load(res + (size_t)tok * K + c);
    raw.to(xr[ch]);
    if (add) {
      float dv[8];
      raw.load(delta + (size_t)tok * K + c);
      raw.to(dv);
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        if (expand) dv[q] = round_t<T>(dv[q] + dot_rank(ys, bin + ((size_t)s * K + c + q) * r, r));
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
    Vec8<T> raw;
    raw.load(nw + c);
    raw.to(wv);
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
#pragma unroll
    for (int jj = 0; jj < NS_ROWS; ++jj) {
      if (j0 + jj < pr) {
        Vec8<T> raw;
        if (sizeof(T) == 2 && ch == 0) {
          raw = pre[sizeof(T) == 2 ? jj : 0];
        } else {
          raw.load(arow + (size_t)jj * K + c);
        }
        float av[8];
        raw.to(av);
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

constexpr int SS_MAX_R = 64;  // ranks lora_silu_shrink takes

// Grid (ceil(n / 256), T), 256 threads. Column c = blockIdx.x * 256 + tid of token t on slot s:
//   g = bf16(gu[t, c] + y[t, :r] · b[s, c]),  u = bf16(gu[t, n + c] + y[t, r:] · b[s, n + c])
//   act[t, c] = bf16(silu(g) * u)
//   yd[t, blockIdx.x, j] = sum over the block's columns of act[t, c] * a[s, j, c], j < r
// (y [T, 2r]: the gate|up shrink; b [slots, 2n, r]; a: down's [slots, r, n]). A token on no
// adapter gets the plain SiLU product and no partial sums.
template <typename T>
__device__ void lora_silu_shrink(const T* __restrict__ gu, const float* __restrict__ y,
                                 const T* __restrict__ b, T* __restrict__ act,
                                 const T* __restrict__ a, float* __restrict__ yd,
                                 const uint32_t* __restrict__ tiles, int ntiles, int slots, int n,
                                 int r) {
  __shared__ float red[8][SS_MAX_R];
  pdl_trigger();
  const int tok = blockIdx.y, c = blockIdx.x * 256 + threadIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t s = token_slot(tiles, ntiles, tok, slots);
  const bool on = s != 0xffffffffu, in = c < n;
  pdl_wait();
  float g = 0.f, u = 0.f;
  if (in) {
    g = to_f(gu[(size_t)tok * 2 * n + c]);
    u = to_f(gu[(size_t)tok * 2 * n + n + c]);
    if (on) {
      const float* yt = y + (size_t)tok * 2 * r;
      g = round_t<T>(g + dot_rank(yt, b + ((size_t)s * 2 * n + c) * r, r));
      u = round_t<T>(u + dot_rank(yt + r, b + ((size_t)s * 2 * n + n + c) * r, r));
    }
  }
  const float v = round_t<T>(g / (1.f + __expf(-g)) * u);
  if (in) act[(size_t)tok * n + c] = from_f<T>(v);
  if (!on) return;  // uniform over the block
  for (int j = 0; j < r; ++j) {
    const float p = in ? v * to_f(a[((size_t)s * r + j) * n + c]) : 0.f;
    const float w = warp_sum(p);
    if (lane == 0) red[warp][j] = w;
  }
  __syncthreads();
  if (threadIdx.x < r) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) sum += red[w][threadIdx.x];
    yd[((size_t)tok * gridDim.x + blockIdx.x) * r + threadIdx.x] = sum;
  }
}

#define LORA_FUSED(T, S)                                                                        \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      lora_norm_shrink_##S(const T* res, const T* delta, T* res_out, const T* nw, float eps,    \
                           int add, const float* yin, int parts, const T* bin, T* h,            \
                           const T* a, float* yout, int pr, const uint32_t* tiles, int ntiles,  \
                           int slots, int K, int r) {                                           \
    lora_norm_shrink<T>(res, delta, res_out, nw, eps, add, yin, parts, bin, h, a, yout, pr,    \
                        tiles, ntiles, slots, K, r);                                            \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      lora_silu_shrink_##S(const T* gu, const float* y, const T* b, T* act, const T* a,         \
                           float* yd, const uint32_t* tiles, int ntiles, int slots, int n,      \
                           int r) {                                                             \
    lora_silu_shrink<T>(gu, y, b, act, a, yd, tiles, ntiles, slots, n, r);                      \
  }

LORA_FUSED(__nv_bfloat16, bf16)
LORA_FUSED(float, f32)
