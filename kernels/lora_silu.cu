// LoRA steps of up to 64 rows with fewer launches on the step's critical path
// (LaunchOptions::lora_overlap; launchers: src/engine/cuda/lora_overlap.rs, the slots'
// layout: src/engine/model/lora_slots.rs): the gate|up delta's expand is one launch with the
// SiLU product (lora_expand_silu), and the o and down deltas' expands are one launch with the
// add+RMSNorm after them (lora_add_rmsnorm); both round where the separate launches round
// (the expanded output to T, then the SiLU product or the residual sum), so their results are
// those launches' bit for bit. Adapter weights and the tile table are written by no
// kernel of a step: the kernel loads them before waiting on the kernel before it, with the
// rank loops unrolled to RMAX (16 or 64) so that a row's loads go out together. With
// LaunchOptions::lora_wide the shrinks are extra output columns of the base matmul (its weight
// stored with every slot's `a` after the base rows, src/engine/model/lora_slots.rs): the `_w`
// kernels read them (rounded to T) at strides, and lora_wide_expand writes the qkv output.
#include <stdint.h>
#include "lora.cuh"

// The slot of token `tok` in the tile table (triples (first token, count, slot) of consecutive
// tokens), or 0xffffffff for a token on no adapter (base rows have no tile; count-0 tiles are
// padding). The whole block calls it.
__device__ __forceinline__ uint32_t token_slot(const uint32_t* __restrict__ tiles, int ntiles,
                                               int tok, int slots) {
  __shared__ uint32_t found;
  if (threadIdx.x == 0) found = 0xffffffffu;
  __syncthreads();
  for (int i = threadIdx.x; i < ntiles; i += blockDim.x) {
    const uint32_t* tl = tiles + 3 * i;
    if ((int)tl[0] <= tok && tok < (int)(tl[0] + tl[1]) && tl[2] < (uint32_t)slots) found = tl[2];
  }
  __syncthreads();
  return found;
}

// Token tok's shrink on slot s: `cols` values from y + tok * ldy + s * sy. An f32 shrink (the
// shrink kernels' scratch) is read where it lies; a shrink of type T (the wide matmul's extra
// columns, LaunchOptions::lora_wide) is converted once into shared memory `sh` by the block
// (`on` is uniform over it).
template <typename T, typename Y>
__device__ __forceinline__ const float* shrink_row(const Y* __restrict__ y, int tok, int ldy,
                                                   int sy, uint32_t s, bool on, int cols,
                                                   float* sh) {
  if constexpr (sizeof(Y) == 4) {
    return on ? y + (size_t)tok * ldy + (size_t)s * sy : y;
  } else {
    if (on) {
      const Y* row = y + (size_t)tok * ldy + (size_t)s * sy;
      for (int i = threadIdx.x; i < cols; i += blockDim.x) sh[i] = to_f(row[i]);
      __syncthreads();
    }
    return sh;
  }
}

// Grid (ceil(n / 256), T), 256 threads. Column c = blockIdx.x * 256 + tid of token t on slot s:
//   g = bf16(gu[t, c] + y[t, :r] · b[s, c]),  u = bf16(gu[t, n + c] + y[t, r:] · b[s, n + c])
//   act[t, c] = bf16(silu(g) * u)
// (gu rows ldg apart; y: the gate|up shrink, token t's on slot s at y + t * ldy + s * sy — the
// shrink kernels' f32 [T, 2r] (ldy 2r, sy 0) or the wide matmul's extra columns;
// b [slots, 2n, r]). A token on no adapter gets the plain SiLU product.
template <typename T, int RMAX, typename Y>
__device__ void lora_expand_silu(const T* __restrict__ gu, int ldg, const Y* __restrict__ y,
                                 int ldy, int sy, const T* __restrict__ b, T* __restrict__ act,
                                 const uint32_t* __restrict__ tiles, int ntiles, int slots, int n,
                                 int r) {
  pdl_trigger();
  __shared__ float ysh[sizeof(Y) == 4 ? 1 : 2 * RMAX];
  const int tok = blockIdx.y, c = blockIdx.x * 256 + threadIdx.x;
  const uint32_t s = token_slot(tiles, ntiles, tok, slots);
  const bool on = s != 0xffffffffu, in = c < n;
  RankRow<T, RMAX> bg, bu;  // b's gate and up rows of this column
  if (on && in) {
    bg.load(b + ((size_t)s * 2 * n + c) * r, r);
    bu.load(b + ((size_t)s * 2 * n + n + c) * r, r);
  }
  pdl_wait();
  const float* yt = shrink_row<T>(y, tok, ldy, sy, s, on, 2 * r, ysh);
  if (!in) return;
  float g = to_f(gu[(size_t)tok * ldg + c]);
  float u = to_f(gu[(size_t)tok * ldg + n + c]);
  if (on) {
    g = round_t<T>(g + bg.dot(yt, r));
    u = round_t<T>(u + bu.dot(yt + r, r));
  }
  act[(size_t)tok * n + c] = from_f<T>(g / (1.f + __expf(-g)) * u);
}

// The qkv delta of the wide matmul (LaunchOptions::lora_wide): `wide` [T, ld] holds the base
// output in columns 0..n and every slot's shrink after it (slot s's P * r values at n + s * pr);
// out [T, n] gets out[t, o] = bf16(wide[t, o] + y · b[s, o]) (the expand's rounding; y the
// projection p's r values, p = (o >= s1) + (o >= s2)) for a token on slot s, and wide[t, o]
// itself for a token on no adapter. Grid (ceil(n / 256), T), 256 threads.
template <typename T, int RMAX>
__device__ void lora_wide_expand(const T* __restrict__ wide, int ld, const T* __restrict__ b,
                                 T* __restrict__ out, const uint32_t* __restrict__ tiles,
                                 int ntiles, int slots, int n, int r, int pr, int s1, int s2) {
  pdl_trigger();
  __shared__ float ysh[3 * RMAX];
  const int tok = blockIdx.y, c = blockIdx.x * 256 + threadIdx.x;
  const uint32_t s = token_slot(tiles, ntiles, tok, slots);
  const bool on = s != 0xffffffffu, in = c < n;
  RankRow<T, RMAX> br;
  if (on && in) br.load(b + ((size_t)s * n + c) * r, r);
  pdl_wait();
  const T* row = wide + (size_t)tok * ld;
  const float* ys = shrink_row<T>(row + n, 0, 0, pr, s, on, pr, ysh);
  if (!in) return;
  float v = to_f(row[c]);
  if (on) v = round_t<T>(v + br.dot(ys + ((c >= s1) + (c >= s2)) * r, r));
  out[(size_t)tok * n + c] = from_f<T>(v);
}

// add_rmsnorm (kernels/layer_ops.cu) with the delta of the one-projection matmul before it
// (o, or the previous layer's down) expanded into its input first. A block per row t, on slot
// s from the tiles:
//   d = bf16(delta[t] + y[t] · b[s]ᵀ)   (rows on no adapter: d = delta[t])
//   res_out[t] = bf16(res[t] + d),  out[t] = bf16(res_out[t] * rsqrt(mean(res_out[t]²) + eps) * w)
// (delta rows ldd apart; y: the matmul's shrink, token t's on slot s at y + t * ldy + s * sy,
// as lora_expand_silu reads it; b [slots, n, r]). res and res_out may be one buffer (each
// element is read, then written, by the same thread).
//
// With PRE (LaunchOptions::lora_norm_preload) each thread loads the rows of b and the norm
// weights of its first pre_cols<T, RMAX>() columns before waiting on the kernel before it (written
// by no kernel of a step), so those loads overlap that kernel instead of following the wait;
// the same values in the same order, so the same bits.
template <typename T, int RMAX>
__host__ __device__ constexpr int pre_cols() {
  // bf16 at ranks up to 16 only: at 1024 threads a block (64 registers a thread) f32 rows or
  // ranks above 16 (y then takes 64 registers) would spill.
  return sizeof(T) * RMAX <= 32 ? 2 : 0;
}

template <typename T, int RMAX, bool PRE, typename Y>
__device__ void lora_add_rmsnorm(const T* __restrict__ delta, int ldd, const T* res, T* res_out,
                                 const T* __restrict__ w, T* __restrict__ out, int n, float eps,
                                 const Y* __restrict__ y, int ldy, int sy,
                                 const T* __restrict__ b, const uint32_t* __restrict__ tiles,
                                 int ntiles, int slots, int r) {
  constexpr int NP = PRE ? pre_cols<T, RMAX>() : 0;
  constexpr int NA = NP > 0 ? NP : 1;  // array sizes
  pdl_trigger();
  const size_t row = blockIdx.x;
  const uint32_t s = token_slot(tiles, ntiles, (int)row, slots);
  const bool on = s != 0xffffffffu;
  RankRow<T, RMAX> pb[NA];
  T pw[NA];
#pragma unroll
  for (int q = 0; q < NP; ++q) {
    const int i = threadIdx.x + q * blockDim.x;
    if (i < n) {
      pw[q] = w[i];
      if (on) pb[q].load(b + ((size_t)s * n + i) * r, r);
    }
  }
  pdl_wait();
  float ys[RMAX];
#pragma unroll
  for (int i = 0; i < RMAX; ++i)
    ys[i] = (on && i < r) ? to_f(y[row * ldy + (size_t)s * sy + i]) : 0.f;
  float ss = 0.f;
  int q = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x, ++q) {
    float d = to_f(delta[row * ldd + i]);
    if (on) {
      RankRow<T, RMAX> br;
      if (q < NP)
        br = reg_pick(pb, q);
      else
        br.load(b + ((size_t)s * n + i) * r, r);
      d = round_t<T>(d + br.dot(ys, r));
    }
    const T sum = from_f<T>(to_f(res[row * n + i]) + d);
    res_out[row * n + i] = sum;
    const float v = to_f(sum);
    ss += v * v;
  }
  // add_rmsnorm's block_sum, so the norm is the same bits.
  const float inv = rsqrtf(block_sum(ss) / n + eps);
  q = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x, ++q) {
    const T wi = q < NP ? reg_pick(pw, q) : w[i];
    out[row * n + i] = from_f<T>(to_f(res_out[row * n + i]) * inv * to_f(wi));
  }
}

// lora_add_rmsnorm{W}_r{RMAX}_{S} (PRE false) and lora_add_rmsnorm_pre{W}_r{RMAX}_{S} (PRE
// true); W empty: the shrink kernels' f32 y, W _w: the wide matmul's y of type T.
#define LORA_NORM(T, S, RMAX, NAME, PRE, Y, W)                                                  \
  extern "C" __global__ void __launch_bounds__(1024) NAME##W##_r##RMAX##_##S(                   \
      const T* delta, int ldd, const T* res, T* res_out, const T* w, T* out, int n, float eps,  \
      const Y* y, int ldy, int sy, const T* b, const uint32_t* tiles, int ntiles, int slots,    \
      int r) {                                                                                  \
    lora_add_rmsnorm<T, RMAX, PRE, Y>(delta, ldd, res, res_out, w, out, n, eps, y, ldy, sy, b,  \
                                      tiles, ntiles, slots, r);                                 \
  }

#define LORA_FUSED_Y(T, S, RMAX, Y, W)                                                          \
  extern "C" __global__ void __launch_bounds__(256) lora_expand_silu##W##_r##RMAX##_##S(        \
      const T* gu, int ldg, const Y* y, int ldy, int sy, const T* b, T* act,                    \
      const uint32_t* tiles, int ntiles, int slots, int n, int r) {                             \
    lora_expand_silu<T, RMAX, Y>(gu, ldg, y, ldy, sy, b, act, tiles, ntiles, slots, n, r);      \
  }                                                                                             \
  LORA_NORM(T, S, RMAX, lora_add_rmsnorm, false, Y, W)                                          \
  LORA_NORM(T, S, RMAX, lora_add_rmsnorm_pre, true, Y, W)

#define LORA_FUSED(T, S, RMAX)                                                                  \
  LORA_FUSED_Y(T, S, RMAX, float, )                                                             \
  LORA_FUSED_Y(T, S, RMAX, T, _w)                                                               \
  extern "C" __global__ void __launch_bounds__(256) lora_wide_expand_r##RMAX##_##S(             \
      const T* wide, int ld, const T* b, T* out, const uint32_t* tiles, int ntiles, int slots,  \
      int n, int r, int pr, int s1, int s2) {                                                   \
    lora_wide_expand<T, RMAX>(wide, ld, b, out, tiles, ntiles, slots, n, r, pr, s1, s2);        \
  }

// Ranks up to 16 (the common adapters) and up to 64.
LORA_FUSED(__nv_bfloat16, bf16, 16)
LORA_FUSED(__nv_bfloat16, bf16, 64)
LORA_FUSED(float, f32, 16)
LORA_FUSED(float, f32, 64)
