// LoRA steps of 17-64 rows on one-token tiles read by runs of the tile table
// (LaunchOptions::lora_runs; launchers: src/engine/cuda/lora_runs.rs). The table comes sorted
// by slot, so neighbouring tiles are mostly on one adapter: a block takes several tiles and
// reads each adapter row once for the tiles of one slot next to each other, where the
// one-token kernels (kernels/lora.cu, kernels/lora_silu.cu) take a block per token and read
// the token's adapter rows from L2 once per token (64 rows x 393 KB for the 1.7B's gate|up).
// The expands sum and round as the one-token expands do (the same bits); the shrink sums each
// (token, row) in one order of its own, whatever the table's order or the step's size.
// Adapter rows and the tile table are written by no kernel of a step: they are read before
// waiting on the kernel before (programmatic dependent launch, common.cuh).
#include <stdint.h>
#include "lora.cuh"

namespace {

constexpr uint32_t NONE = 0xffffffffu;

// Tile i's token and slot (NONE: past the table, padding, or a slot past those held).
__device__ __forceinline__ void tile_at(const uint32_t* __restrict__ tiles, int ntiles, int i,
                                        int slots, int& tok, uint32_t& slot) {
  tok = 0;
  slot = NONE;
  if (i < ntiles) {
    const uint32_t* tl = tiles + 3 * i;
    if (tl[1] != 0 && tl[2] < (uint32_t)slots) {
      tok = (int)tl[0];
      slot = tl[2];
    }
  }
}

// The RUN tiles of block row blockIdx.y (tokens, slots) and, for each, whether the tile
// before it in the block is on the same slot (its adapter rows are then reused, not loaded).
template <int RUN>
__device__ __forceinline__ void block_tiles(const uint32_t* __restrict__ tiles, int ntiles,
                                            int slots, int (&tok)[RUN], uint32_t (&sl)[RUN],
                                            bool (&same)[RUN]) {
#pragma unroll
  for (int c = 0; c < RUN; ++c) {
    tile_at(tiles, ntiles, blockIdx.y * RUN + c, slots, tok[c], sl[c]);
    same[c] = c > 0 && sl[c] != NONE && sl[c] == sl[c - 1];
  }
}

}  // namespace

// Shrink: grid (ceil(pr / 2), ceil(ntiles / 8)), 256 threads. Warp w takes tile
// blockIdx.y * 8 + w (token t on slot s) and rows j0 = 2 * blockIdx.x, j0 + 1 of a[s]:
//   y[t, j] = warp_sum over lanes of (sum over the lane's chunks k = 8 * lane + 256 * q, q
//   ascending, of the chunk's eight products x[t, k + e] * a[s, j, k + e], e ascending).
// The block's warps on one slot read the same rows of a (one L2 read, the rest from L1); a
// lane has B chunks of a and of x in flight at once (1.7B's 2,048 inputs: one round).
template <typename T>
__device__ void lora_shrink_runs(const T* __restrict__ x, const T* __restrict__ a,
                                 const uint32_t* __restrict__ tiles, int ntiles,
                                 float* __restrict__ y, int in, int pr, int slots) {
  constexpr int B = 8;
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j0 = 2 * blockIdx.x;
  int t;
  uint32_t s;
  tile_at(tiles, ntiles, blockIdx.y * 8 + warp, slots, t, s);
  if (s == NONE || j0 >= pr) return;  // uniform over the warp; no block barrier follows
  const bool two = j0 + 1 < pr;
  const T* a0 = a + ((size_t)s * pr + j0) * in;
  const T* a1 = two ? a0 + in : a0;  // without a second row, the first again (not written)
  Vec8<T> av0[B], av1[B];
  auto load_a = [&](int k0) {
#pragma unroll
    for (int q = 0; q < B; ++q) {
      const int k = k0 + 256 * q;
      if (k < in) {
        av0[q].load(a0 + k);
        av1[q].load(a1 + k);
      }
    }
  };
  load_a(8 * lane);
  pdl_wait();
  const T* xr = x + (size_t)t * in;
  float acc0 = 0.f, acc1 = 0.f;
  for (int k0 = 8 * lane; k0 < in; k0 += 256 * B) {
    if (k0 != 8 * lane) load_a(k0);
    Vec8<T> xv[B];
#pragma unroll
    for (int q = 0; q < B; ++q)
      if (k0 + 256 * q < in) xv[q].load(xr + k0 + 256 * q);
#pragma unroll
    for (int q = 0; q < B; ++q) {
      if (k0 + 256 * q < in) {
        float xf[8], af[8];
        xv[q].to(xf);
        av0[q].to(af);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc0 += xf[e] * af[e];
        av1[q].to(af);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc1 += xf[e] * af[e];
      }
    }
  }
  acc0 = warp_sum(acc0);
  acc1 = warp_sum(acc1);
  if (lane == 0) {
    y[(size_t)t * pr + j0] = acc0;
    if (two) y[(size_t)t * pr + j0 + 1] = acc1;
  }
}

// Expand in place: grid (ceil(nout / 256), ceil(ntiles / RUN)), 256 threads. Column o of the
// tokens t of the block's RUN tiles: out[t, o] = T(out[t, o] + y[t, p * r:][:r] · b[s, o])
// (p: the projection o belongs to, as lora_expand), the dot in rank order as the one-token
// expand sums it; a tile on the slot of the tile before it reuses that row of b.
template <typename T, int RMAX, int RUN>
__device__ void lora_expand_runs(const float* __restrict__ y, const T* __restrict__ b,
                                 const uint32_t* __restrict__ tiles, int ntiles,
                                 T* __restrict__ out, int nout, int r, int pr, int s1, int s2,
                                 int slots) {
  pdl_trigger();
  __shared__ float ys[RUN * 3 * RMAX];
  const int o = blockIdx.x * 256 + threadIdx.x;
  int tok[RUN];
  uint32_t sl[RUN];
  bool same[RUN];
  block_tiles<RUN>(tiles, ntiles, slots, tok, sl, same);
  const int oc = min(o, nout - 1);
  RankRow<T, RMAX> br[RUN];
#pragma unroll
  for (int c = 0; c < RUN; ++c)
    if (sl[c] != NONE && !same[c]) br[c].load(b + ((size_t)sl[c] * nout + oc) * r, r);
#pragma unroll
  for (int c = 1; c < RUN; ++c)
    if (same[c]) br[c] = br[c - 1];
  pdl_wait();
  for (int e = threadIdx.x; e < RUN * pr; e += blockDim.x) {
    int t;
    uint32_t s;
    tile_at(tiles, ntiles, blockIdx.y * RUN + e / pr, slots, t, s);
    ys[e] = s != NONE ? y[(size_t)t * pr + e % pr] : 0.f;
  }
  __syncthreads();
  if (o >= nout) return;
  const int p = (o >= s1) + (o >= s2);
#pragma unroll
  for (int c = 0; c < RUN; ++c) {
    if (sl[c] != NONE) {
      const float acc = br[c].dot(ys + c * pr + p * r, r);
      T* dst = out + (size_t)tok[c] * nout + o;
      *dst = from_f<T>(to_f(*dst) + acc);
    }
  }
}

// The gate|up expand with the SiLU product (lora_expand_silu's arithmetic) by runs: grid
// (ceil(n / 256), ceil(ntiles / RUN) + ceil(rows / RUN)), 256 threads. The first
// ceil(ntiles / RUN) rows of blocks take the tiles' tokens, RUN a block (a tile on the slot of
// the one before it reuses its rows of b); the rest take the step's rows RUN a block and write
// the plain product for those on no adapter.
template <typename T, int RMAX, int RUN>
__device__ void lora_expand_silu_runs(const T* __restrict__ gu, const float* __restrict__ y,
                                      const T* __restrict__ b, T* __restrict__ act,
                                      const uint32_t* __restrict__ tiles, int ntiles, int slots,
                                      int n, int r, int rows) {
  pdl_trigger();
  const int col = blockIdx.x * 256 + threadIdx.x;
  const int tile_rows = (ntiles + RUN - 1) / RUN;
  if ((int)blockIdx.y >= tile_rows) {
    // Rows on no adapter: mark the block's rows that some tile holds.
    __shared__ uint32_t held[RUN];
    const int r0 = ((int)blockIdx.y - tile_rows) * RUN;
    if (threadIdx.x < RUN) held[threadIdx.x] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < ntiles; i += blockDim.x) {
      const uint32_t* tl = tiles + 3 * i;
      if (tl[2] >= (uint32_t)slots) continue;
      for (uint32_t q = 0; q < tl[1]; ++q) {
        const int t = (int)(tl[0] + q) - r0;
        if (t >= 0 && t < RUN) held[t] = 1;
      }
    }
    __syncthreads();
    pdl_wait();
    if (col >= n) return;
#pragma unroll
    for (int c = 0; c < RUN; ++c) {
      const int t = r0 + c;
      if (t < rows && !held[c]) {
        const float g = to_f(gu[(size_t)t * 2 * n + col]);
        const float u = to_f(gu[(size_t)t * 2 * n + n + col]);
        act[(size_t)t * n + col] = from_f<T>(g / (1.f + __expf(-g)) * u);
      }
    }
    return;
  }
  __shared__ float ys[RUN * 2 * RMAX];
  int tok[RUN];
  uint32_t sl[RUN];
  bool same[RUN];
  block_tiles<RUN>(tiles, ntiles, slots, tok, sl, same);
  const int cc = min(col, n - 1);
  RankRow<T, RMAX> bg[RUN], bu[RUN];  // b's gate and up rows of this column
#pragma unroll
  for (int c = 0; c < RUN; ++c) {
    if (sl[c] != NONE && !same[c]) {
      bg[c].load(b + ((size_t)sl[c] * 2 * n + cc) * r, r);
      bu[c].load(b + ((size_t)sl[c] * 2 * n + n + cc) * r, r);
    }
  }
#pragma unroll
  for (int c = 1; c < RUN; ++c) {
    if (same[c]) {
      bg[c] = bg[c - 1];
      bu[c] = bu[c - 1];
    }
  }
  pdl_wait();
  for (int e = threadIdx.x; e < RUN * 2 * r; e += blockDim.x) {
    int t;
    uint32_t s;
    tile_at(tiles, ntiles, blockIdx.y * RUN + e / (2 * r), slots, t, s);
    ys[e] = s != NONE ? y[(size_t)t * 2 * r + e % (2 * r)] : 0.f;
  }
  __syncthreads();
  if (col >= n) return;
#pragma unroll
  for (int c = 0; c < RUN; ++c) {
    if (sl[c] != NONE) {
      const size_t t = tok[c];
      float g = to_f(gu[t * 2 * n + col]);
      float u = to_f(gu[t * 2 * n + n + col]);
      g = round_t<T>(g + bg[c].dot(ys + c * 2 * r, r));
      u = round_t<T>(u + bu[c].dot(ys + c * 2 * r + r, r));
      act[t * n + col] = from_f<T>(g / (1.f + __expf(-g)) * u);
    }
  }
}

// Tiles a block of the expand (RUN_E) and of the expand+SiLU (RUN_S) takes, by the rank
// bound (their rows of b live in registers): src/engine/cuda/lora_runs.rs has the same.
#define LORA_RUNS(T, S)                                                                         \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      lora_shrink_runs_##S(const T* x, const T* a, const uint32_t* tiles, int ntiles, float* y, \
                           int in, int pr, int slots) {                                         \
    lora_shrink_runs<T>(x, a, tiles, ntiles, y, in, pr, slots);                                 \
  }                                                                                             \
  LORA_RUNS_R(T, S, 16, 8, 4)                                                                   \
  LORA_RUNS_R(T, S, 64, 2, 2)

#define LORA_RUNS_R(T, S, RMAX, RUN_E, RUN_S)                                                   \
  extern "C" __global__ void __launch_bounds__(256) lora_expand_runs_r##RMAX##_##S(             \
      const float* y, const T* b, const uint32_t* tiles, int ntiles, T* out, int nout, int r,   \
      int pr, int s1, int s2, int slots) {                                                      \
    lora_expand_runs<T, RMAX, RUN_E>(y, b, tiles, ntiles, out, nout, r, pr, s1, s2, slots);     \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256) lora_expand_silu_runs_r##RMAX##_##S(        \
      const T* gu, const float* y, const T* b, T* act, const uint32_t* tiles, int ntiles,       \
      int slots, int n, int r, int rows) {                                                      \
    lora_expand_silu_runs<T, RMAX, RUN_S>(gu, y, b, act, tiles, ntiles, slots, n, r, rows);     \
  }

LORA_RUNS(__nv_bfloat16, bf16)
LORA_RUNS(float, f32)
