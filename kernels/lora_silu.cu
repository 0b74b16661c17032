// LoRA steps of up to 64 rows with fewer launches on the step's critical path
// (LaunchOptions::lora_overlap; launchers: src/engine/cuda/lora_overlap.rs, the slots'
// layout: src/engine/model/lora_slots.rs): the gate|up delta's expand is one launch with the
// SiLU product (lora_expand_silu), and the o and down deltas' expands are one launch with the
// add+RMSNorm after them (lora_add_rmsnorm); both round where the separate launches round
// (the expanded output to T, then the SiLU product or the residual sum), so their results are
// those launches' bit for bit. Adapter weights and the tile table are written by no
// kernel of a step: the kernel loads them before waiting on the kernel before it, with the
// rank loops unrolled to RMAX (16 or 64) so that a row's loads go out together.
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

// Grid (ceil(n / 256), T), 256 threads. Column c = blockIdx.x * 256 + tid of token t on slot s:
//   g = bf16(gu[t, c] + y[t, :r] · b[s, c]),  u = bf16(gu[t, n + c] + y[t, r:] · b[s, n + c])
//   act[t, c] = bf16(silu(g) * u)
// (y [T, 2r]: the gate|up shrink; b [slots, 2n, r]). A token on no adapter gets the plain
// SiLU product.
template <typename T, int RMAX>
__device__ void lora_expand_silu(const T* __restrict__ gu, const float* __restrict__ y,
                                 const T* __restrict__ b, T* __restrict__ act,
                                 const uint32_t* __restrict__ tiles, int ntiles, int slots, int n,
                                 int r) {
  pdl_trigger();
  const int tok = blockIdx.y, c = blockIdx.x * 256 + threadIdx.x;
  const uint32_t s = token_slot(tiles, ntiles, tok, slots);
  const bool on = s != 0xffffffffu, in = c < n;
  RankRow<T, RMAX> bg, bu;  // b's gate and up rows of this column
  if (on && in) {
    bg.load(b + ((size_t)s * 2 * n + c) * r, r);
    bu.load(b + ((size_t)s * 2 * n + n + c) * r, r);
  }
  pdl_wait();
  if (!in) return;
  float g = to_f(gu[(size_t)tok * 2 * n + c]);
  float u = to_f(gu[(size_t)tok * 2 * n + n + c]);
  if (on) {
    const float* yt = y + (size_t)tok * 2 * r;
    g = round_t<T>(g + bg.dot(yt, r));
    u = round_t<T>(u + bu.dot(yt + r, r));
  }
  act[(size_t)tok * n + c] = from_f<T>(g / (1.f + __expf(-g)) * u);
}

// add_rmsnorm (kernels/layer_ops.cu) with the delta of the one-projection matmul before it
// (o, or the previous layer's down) expanded into its input first. A block per row t, on slot
// s from the tiles:
//   d = bf16(delta[t] + y[t] · b[s]ᵀ)   (rows on no adapter: d = delta[t])
//   res_out[t] = bf16(res[t] + d),  out[t] = bf16(res_out[t] * rsqrt(mean(res_out[t]²) + eps) * w)
// (y [T, r]: the matmul's shrink; b [slots, n, r]). res and res_out may be one buffer (each
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

template <typename T, int RMAX, bool PRE>
__device__ void lora_add_rmsnorm(const T* __restrict__ delta, const T* res, T* res_out,
                                 const T* __restrict__ w, T* __restrict__ out, int n, float eps,
                                 const float* __restrict__ y, const T* __restrict__ b,
                                 const uint32_t* __restrict__ tiles, int ntiles, int slots,
                                 int r) {
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
  for (int i = 0; i < RMAX; ++i) ys[i] = (on && i < r) ? y[row * r + i] : 0.f;
  float ss = 0.f;
  int q = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x, ++q) {
    float d = to_f(delta[row * n + i]);
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

// lora_add_rmsnorm_r{RMAX}_{S} (PRE false) and lora_add_rmsnorm_pre_r{RMAX}_{S} (PRE true).
#define LORA_NORM(T, S, RMAX, NAME, PRE)                                                        \
  extern "C" __global__ void __launch_bounds__(1024) NAME##_r##RMAX##_##S(                      \
      const T* delta, const T* res, T* res_out, const T* w, T* out, int n, float eps,           \
      const float* y, const T* b, const uint32_t* tiles, int ntiles, int slots, int r) {        \
    lora_add_rmsnorm<T, RMAX, PRE>(delta, res, res_out, w, out, n, eps, y, b, tiles, ntiles,    \
                                   slots, r);                                                   \
  }

#define LORA_FUSED(T, S, RMAX)                                                                  \
  extern "C" __global__ void __launch_bounds__(256) lora_expand_silu_r##RMAX##_##S(             \
      const T* gu, const float* y, const T* b, T* act, const uint32_t* tiles, int ntiles,       \
      int slots, int n, int r) {                                                                \
    lora_expand_silu<T, RMAX>(gu, y, b, act, tiles, ntiles, slots, n, r);                       \
  }                                                                                             \
  LORA_NORM(T, S, RMAX, lora_add_rmsnorm, false)                                                \
  LORA_NORM(T, S, RMAX, lora_add_rmsnorm_pre, true)

// Ranks up to 16 (the common adapters) and up to 64.
LORA_FUSED(__nv_bfloat16, bf16, 16)
LORA_FUSED(__nv_bfloat16, bf16, 64)
LORA_FUSED(float, f32, 16)
LORA_FUSED(float, f32, 64)
