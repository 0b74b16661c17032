// LoRA deltas for steps of one-token tiles with the tokens of a slot read together
// (LaunchOptions::lora_grouped; launchers: src/engine/cuda/lora_grouped_ops.rs, the slots'
// layout: src/engine/model/lora_slots.rs). The one-token kernels of lora.cu read a slot's
// adapter rows once per token (at 64 tokens on 8 adapters the qkv shrink re-reads 6 MB from
// L2 and takes longer than the qkv matmul). Here the tile table (at most 64 one-token tiles,
// sorted by slot by the host) is cut into groups: runs of consecutive tiles on one slot, in
// pieces of at most eight; block y takes group y (blocks past the last group return at once),
// and reads its slot's rows of a or b once for all its tokens. Any order of the table is
// served (an unsorted one makes more, shorter groups). Blocks without a group return before
// waiting on the kernel before them (common.cuh); a LoRA step has a tile on a held slot, so
// some block of every launch waits, and the launch ends after the kernel before it.
//
// Shrink: y[t, j] = sum_k x[t, k] * a[slot, j, k] on tensor cores (mma m16n8k16, bf16 in, f32
// sums): a block takes 16 rows of a, one group (the mma's 8 columns are its tokens) and a
// slice of k (at most 1,024 by the launcher's rule); its 4 warps split the slice and meet in
// shared memory. With more than one slice (gridDim.z) the blocks write partial sums and the
// last block of a (rows, group) pair to finish (a counter it resets) adds them in slice
// order: the sums do not depend on which block ran first. Within a lane, mma's k order is a
// permutation of memory order (each lane loads eight consecutive values of a row of a and of
// x, and the same permutation applies to both operands), so one 16-byte load feeds two mmas
// (gemv.cu's tensor-core kernels do the same).
//
// Expand: out[t, o] += sum_r y[t, p * R + r] * b[slot, o, r], p the projection of output row
// o; a thread per output row, a block per 128 rows and group; the row of b is loaded once a
// group. Sums and rounding are lora.cu's expand's (r in order, then out rounded once).
#include <stdint.h>
#include "common.cuh"

namespace {

constexpr int WIN = 8;  // tiles (tokens) of a group at most: one mma's columns

// Group blockIdx.y of the tile table (ntiles <= 64, the launcher checks) in shared memory:
// tok[q] the token of its q-th tile (-1 past its end), *slot its slot. A tile is live when its
// count is not 0 and its slot is held; a run is a stretch of live tiles on one slot; a group
// starts at every eighth tile of a run. The block's first 64 threads take a tile each; two
// ballots find the run and group starts. Returns whether the group exists. The whole block
// calls it (at least 64 threads).
__device__ __forceinline__ bool load_group(const uint32_t* __restrict__ tiles, int ntiles,
                                           int slots, int (&tok)[WIN], uint32_t& slot) {
  __shared__ uint32_t sl[64];
  __shared__ int tk[64];
  __shared__ uint32_t mask[2][2];  // [run starts, group starts][warp]
  __shared__ bool found;
  const int i = threadIdx.x, lane = i & 31, w = i >> 5;
  bool live = false;
  if (i < 64) {
    uint32_t s = 0xffffffffu;
    int t = -1;
    if (i < ntiles) {
      const uint32_t* tl = tiles + 3 * i;
      if (tl[1] > 0 && tl[2] < (uint32_t)slots) {
        t = (int)tl[0];
        s = tl[2];
      }
    }
    live = t >= 0;
    sl[i] = s;
    tk[i] = t;
  }
  if (i < WIN) tok[i] = -1;
  if (i == 0) found = false;
  __syncthreads();
  if (i < 64) {
    const bool rs = live && (i == 0 || tk[i - 1] < 0 || sl[i - 1] != sl[i]);
    const uint32_t b = __ballot_sync(0xffffffffu, rs);
    if (lane == 0) mask[0][w] = b;
  }
  __syncthreads();
  const unsigned long long runs = ((unsigned long long)mask[0][1] << 32) | mask[0][0];
  const unsigned long long upto = i < 64 ? (~0ull >> (63 - i)) : 0ull;  // bits 0..i
  int start = 0;
  if (i < 64) {
    const int run = 63 - __clzll(runs & upto);  // live: a run starts at or before i
    start = live && (i - run) % WIN == 0;
    const uint32_t b = __ballot_sync(0xffffffffu, start);
    if (lane == 0) mask[1][w] = b;
  }
  __syncthreads();
  const unsigned long long groups = ((unsigned long long)mask[1][1] << 32) | mask[1][0];
  if (i < 64 && live) {
    const unsigned long long before = groups & upto;
    if (__popcll(before) - 1 == (int)blockIdx.y) {
      const int first = 63 - __clzll(before);  // this tile's group start
      tok[i - first] = tk[i];
      if (i == first) {
        slot = sl[i];
        found = true;
      }
    }
  }
  __syncthreads();
  return found;
}

constexpr int SHRINK_WARPS = 4;
constexpr int UNROLL = 4;  // k chunks of 32 whose loads a warp issues together

__device__ void lora_shrink_grouped(const __nv_bfloat16* __restrict__ x,
                                    const __nv_bfloat16* __restrict__ a,
                                    const uint32_t* __restrict__ tiles, int ntiles,
                                    float* __restrict__ y, float* __restrict__ part,
                                    uint32_t* __restrict__ counters, int rows, int in, int pr,
                                    int slots) {
  pdl_trigger();
  __shared__ int tok[WIN];
  __shared__ uint32_t slot;
  __shared__ float red[SHRINK_WARPS][16][WIN];
  __shared__ bool last;
  if (!load_group(tiles, ntiles, slots, tok, slot)) return;  // uniform over the block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tig = lane & 3;
  const int j0 = blockIdx.x * 16;
  const int ja = j0 + g, jb = j0 + g + 8;  // this lane's rows of a (A operand rows g, g + 8)
  const int slices = gridDim.z;
  const int kslice = in / slices;  // a multiple of 32 * SHRINK_WARPS (the launcher checks)
  const int k0 = blockIdx.z * kslice;
  const int chunks = kslice / 32;
  pdl_wait();
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const uint32_t s = slot;
  // Column g of the B operand is the group's token g (zeros past the group's end).
  const bool mine = tok[g] >= 0;
  const __nv_bfloat16* xr = x + (size_t)(mine ? tok[g] : 0) * in + k0 + tig * 8;
  const __nv_bfloat16* ra = a + ((size_t)s * pr + min(ja, pr - 1)) * in + k0 + tig * 8;
  const __nv_bfloat16* rb = a + ((size_t)s * pr + min(jb, pr - 1)) * in + k0 + tig * 8;
  for (int c0 = warp; c0 < chunks; c0 += SHRINK_WARPS * UNROLL) {
    uint4 va[UNROLL], vb[UNROLL], vx[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = c0 + u * SHRINK_WARPS;
      const bool in_range = c < chunks;
      va[u] = in_range && ja < pr ? *reinterpret_cast<const uint4*>(ra + c * 32) : zero;
      vb[u] = in_range && jb < pr ? *reinterpret_cast<const uint4*>(rb + c * 32) : zero;
      vx[u] = in_range && mine ? *reinterpret_cast<const uint4*>(xr + c * 32) : zero;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      // Values 0-3 of the lane's eight are mma k (2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9)
      // of the first mma, values 4-7 of the second; rows g (va) and g + 8 (vb).
      mma_bf16(acc, va[u].x, vb[u].x, va[u].y, vb[u].y, vx[u].x, vx[u].y);
      mma_bf16(acc, va[u].z, vb[u].z, va[u].w, vb[u].w, vx[u].z, vx[u].w);
    }
  }
  // acc: rows g (0, 1) and g + 8 (2, 3), columns (tokens) 2 tig and 2 tig + 1.
  red[warp][g][2 * tig] = acc[0];
  red[warp][g][2 * tig + 1] = acc[1];
  red[warp][g + 8][2 * tig] = acc[2];
  red[warp][g + 8][2 * tig + 1] = acc[3];
  __syncthreads();
  const int i = threadIdx.x >> 3, q = threadIdx.x & 7;  // 128 threads: 16 rows x 8 tokens
  float v = 0.f;
#pragma unroll
  for (int w = 0; w < SHRINK_WARPS; ++w) v += red[w][i][q];
  const int j = j0 + i;
  const bool ok = tok[q] >= 0 && j < pr;
  if (slices == 1) {
    if (ok) y[(size_t)tok[q] * pr + j] = v;
    return;
  }
  if (ok) part[((size_t)blockIdx.z * rows + tok[q]) * pr + j] = v;
  __threadfence();
  __syncthreads();
  uint32_t* counter = counters + blockIdx.y * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == (uint32_t)(slices - 1);
  __syncthreads();
  if (!last) return;  // uniform over the block
  __threadfence();
  if (ok) {
    float sum = 0.f;
    for (int z = 0; z < slices; ++z) sum += __ldcg(part + ((size_t)z * rows + tok[q]) * pr + j);
    y[(size_t)tok[q] * pr + j] = sum;
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (and graph replay)
}

constexpr int EXPAND_THREADS = 128;

template <int RMAX>
__device__ void lora_expand_grouped(const float* __restrict__ y,
                                    const __nv_bfloat16* __restrict__ b,
                                    const uint32_t* __restrict__ tiles, int ntiles,
                                    __nv_bfloat16* __restrict__ out, int nout, int r, int pr,
                                    int s1, int s2, int slots) {
  pdl_trigger();
  __shared__ int tok[WIN];
  __shared__ uint32_t slot;
  __shared__ float ys[WIN * 3 * RMAX];
  if (!load_group(tiles, ntiles, slots, tok, slot)) return;  // uniform over the block
  const int o = blockIdx.x * EXPAND_THREADS + threadIdx.x;
  const int oc = min(o, nout - 1);
  // The slot's row of b before the wait (adapter rows are written by no kernel of a step;
  // the tiles were read above).
  float bv[RMAX];
  const __nv_bfloat16* br = b + ((size_t)slot * nout + oc) * r;
#pragma unroll
  for (int c = 0; c < RMAX / 8; ++c)
    if (c * 8 < r) bf16x8_to_f32(*reinterpret_cast<const uint4*>(br + c * 8), bv + c * 8);
  pdl_wait();
  for (int i = threadIdx.x; i < WIN * pr; i += EXPAND_THREADS) {
    const int q = i / pr;
    ys[i] = tok[q] >= 0 ? y[(size_t)tok[q] * pr + i % pr] : 0.f;
  }
  __syncthreads();
  if (o >= nout) return;
  const int p = (o >= s1) + (o >= s2);
  float old[WIN];
#pragma unroll
  for (int q = 0; q < WIN; ++q)
    old[q] = tok[q] >= 0 ? to_f(out[(size_t)tok[q] * nout + o]) : 0.f;
#pragma unroll
  for (int q = 0; q < WIN; ++q) {
    if (tok[q] < 0) continue;
    const float* yq = ys + q * pr + p * r;
    float acc = 0.f;
#pragma unroll
    for (int i0 = 0; i0 < RMAX; i0 += 8)
      if (i0 < r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc += yq[i0 + i] * bv[i0 + i];
      }
    out[(size_t)tok[q] * nout + o] = from_f<__nv_bfloat16>(old[q] + acc);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(32 * SHRINK_WARPS)
    lora_shrink_grouped_bf16(const __nv_bfloat16* x, const __nv_bfloat16* a,
                             const uint32_t* tiles, int ntiles, float* y, float* part,
                             uint32_t* counters, int rows, int in, int pr, int slots) {
  lora_shrink_grouped(x, a, tiles, ntiles, y, part, counters, rows, in, pr, slots);
}

#define LORA_EXPAND_GROUPED(RMAX)                                                              \
  extern "C" __global__ void __launch_bounds__(EXPAND_THREADS)                                 \
      lora_expand_grouped_r##RMAX##_bf16(const float* y, const __nv_bfloat16* b,               \
                                         const uint32_t* tiles, int ntiles,                    \
                                         __nv_bfloat16* out, int nout, int r, int pr, int s1,  \
                                         int s2, int slots) {                                  \
    lora_expand_grouped<RMAX>(y, b, tiles, ntiles, out, nout, r, pr, s1, s2, slots);           \
  }

LORA_EXPAND_GROUPED(16)
LORA_EXPAND_GROUPED(64)
