// The sparse MLP of Qwen3-MoE on the device (launchers: src/engine/cuda/moe_ops.rs; the
// candle-op reference: src/engine/model/moe.rs). Per sparse layer, after the router's matmul
// (the dense kernels' norm + linear) gives logits [T, E]:
//
//  * moe_route:   per token, softmax (f32) and top-k (ties to the lower id), weights
//                 renormalized when asked and rounded to the compute dtype (as HF casts them);
//                 ids [T * k] u32, w [T * k] f32.
//  * moe_align:   one block (with the routing, `moe_route_align`, for up to 32 tokens): the pairs (token, slot) grouped by expert, `order` [P] (pair
//                 indices, grouped by expert), and tiles (start in order, count <= TM, expert)
//                 over each expert's run, the unused tail of the tile table zeroed.
//  * moe_gate_up: per tile and 8 rows of the expert's gate and up, act = silu(gate) * up for
//                 the tile's pairs (rows of the expert read once per tile); bf16 tiles of 16
//                 or 64 pairs on tensor cores are in moe_mma.cu.
//  * moe_down:    per tile and 8 rows of the expert's down, y[pair] = down · act, times the
//                 pair's weight, rounded as HF rounds it.
//  * moe_sum:     out[t] = the token's pairs' y summed in ascending expert order (a thread
//                 per output column).
//  * moe_norm_router_t{1,2}: for decode steps of 1-2 tokens (LaunchOptions::moe_norm_router),
//                 the add+RMSNorm before the router and the router's matmul in one launch.
//
// Nothing reads the host: the launch shapes depend on T only (the tile table has room for the
// worst case), so decode steps are captured in CUDA graphs. Experts outside this rank's range
// (expert parallelism) are skipped and add nothing.
#include <cuda_bf16.h>
#include <stdint.h>

#include "common.cuh"
#include "moe.cuh"

namespace {

// Routing of one token by one warp for up to 128 experts: lane l holds the probabilities of
// experts l, l + 32, l + 64, l + 96 in registers, read and exponentiated once (the same values
// the general path below recomputes at every pick); a pick marks its expert -2 (probabilities
// are >= 0, experts past e hold -1), lane s keeps pick s and writes it.
template <typename T>
__device__ __forceinline__ void route_small(const T* __restrict__ row, uint32_t* __restrict__ ids,
                                            float* __restrict__ w, int t, int e, int k, int norm,
                                            int lane) {
  float p[4];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    p[j] = lane + 32 * j < e ? to_f(row[lane + 32 * j]) : -INFINITY;
    m = fmaxf(m, p[j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float z = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    p[j] = lane + 32 * j < e ? expf(p[j] - m) : 0.f;
    z += p[j];
  }
  z = warp_sum(z);
#pragma unroll
  for (int j = 0; j < 4; ++j) p[j] = lane + 32 * j < e ? p[j] / z : -1.f;
  float mine_p = 0.f, sum = 0.f;
  uint32_t mine_id = 0;
  for (int s = 0; s < k; ++s) {
    float best = -1.f;
    int best_id = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (p[j] > best) {  // ascending ids within a lane: the first of equals stays
        best = p[j];
        best_id = lane + 32 * j;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (ob > best || (ob == best && oi < best_id)) {
        best = ob;
        best_id = oi;
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (best_id == lane + 32 * j) p[j] = -2.f;
    if (lane == s) {
      mine_p = best;
      mine_id = (uint32_t)best_id;
    }
    sum += best;
  }
  if (lane < k) {
    ids[(size_t)t * k + lane] = mine_id;
    w[(size_t)t * k + lane] = to_f(from_f<T>(norm ? mine_p / sum : mine_p));
  }
}

// One warp per token.
template <typename T>
__device__ void moe_route(const T* __restrict__ logits, uint32_t* __restrict__ ids,
                          float* __restrict__ w, int tokens, int e, int k, int norm) {
  const int lane = threadIdx.x & 31;
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (t >= tokens) return;
  const T* row = logits + (size_t)t * e;
  if (e <= 128) {
    route_small<T>(row, ids, w, t, e, k, norm, lane);
    return;
  }
  float m = -INFINITY;
  for (int i = lane; i < e; i += 32) m = fmaxf(m, to_f(row[i]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float z = 0.f;
  for (int i = lane; i < e; i += 32) z += expf(to_f(row[i]) - m);
  z = warp_sum(z);
  // Lane l owns experts l, l + 32, ... (at most 32 of them: e <= 1024); bit j of `taken`
  // marks expert l + 32 j chosen.
  uint32_t taken = 0;
  float chosen_p[32];
  uint32_t chosen_id[32];
  float sum = 0.f;
  for (int s = 0; s < k; ++s) {
    float best = -1.f;
    int best_id = 0x7fffffff;
    for (int j = 0; lane + 32 * j < e; ++j) {
      if (taken & (1u << j)) continue;
      const float p = expf(to_f(row[lane + 32 * j]) - m) / z;
      if (p > best) {  // ascending ids within a lane: the first of equals stays
        best = p;
        best_id = lane + 32 * j;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (ob > best || (ob == best && oi < best_id)) {
        best = ob;
        best_id = oi;
      }
    }
    if (best_id % 32 == lane) taken |= 1u << (best_id / 32);
    chosen_p[s] = best;
    chosen_id[s] = (uint32_t)best_id;
    sum += best;
  }
  if (lane == 0) {
    for (int s = 0; s < k; ++s) {
      const float v = norm ? chosen_p[s] / sum : chosen_p[s];
      ids[(size_t)t * k + s] = chosen_id[s];
      w[(size_t)t * k + s] = to_f(from_f<T>(v));
    }
  }
}

}  // namespace

// One block of 1024 threads, 2 * e ints of dynamic shared memory (e <= 1024): counts per
// expert, then one thread per expert scans the counts and its tile counts (warp shuffles, then
// the warps' totals) and writes its own tiles; then every pair takes its place.
__device__ __forceinline__ void align_pairs(const uint32_t* __restrict__ ids,
                                            uint32_t* __restrict__ order,
                                            uint32_t* __restrict__ tiles, int pairs, int e, int tm,
                                            int max_tiles) {
  extern __shared__ int sh[];
  int* counts = sh;
  int* cursor = sh + e;
  __shared__ int warp_pairs[32], warp_tiles[32];
  __shared__ int ntiles;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < e; i += blockDim.x) counts[i] = 0;
  __syncthreads();
  for (int p = tid; p < pairs; p += blockDim.x) atomicAdd(&counts[ids[p] % e], 1);
  __syncthreads();
  const int c = tid < e ? counts[tid] : 0;
  const int nt = (c + tm - 1) / tm;
  int sc = c, st = nt;  // inclusive scans within the warp
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int yc = __shfl_up_sync(0xffffffffu, sc, o);
    const int yt = __shfl_up_sync(0xffffffffu, st, o);
    if (lane >= o) {
      sc += yc;
      st += yt;
    }
  }
  if (lane == 31) {
    warp_pairs[warp] = sc;
    warp_tiles[warp] = st;
  }
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    int vc = lane < nw ? warp_pairs[lane] : 0, vt = lane < nw ? warp_tiles[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int yc = __shfl_up_sync(0xffffffffu, vc, o);
      const int yt = __shfl_up_sync(0xffffffffu, vt, o);
      if (lane >= o) {
        vc += yc;
        vt += yt;
      }
    }
    warp_pairs[lane] = vc;  // inclusive over warps
    warp_tiles[lane] = vt;
  }
  __syncthreads();
  if (tid < e) {
    const int run = sc - c + (warp > 0 ? warp_pairs[warp - 1] : 0);
    int tile = st - nt + (warp > 0 ? warp_tiles[warp - 1] : 0);
    cursor[tid] = run;
    for (int s = 0; s < c && tile < max_tiles; s += tm, ++tile) {
      tiles[3 * tile] = run + s;
      tiles[3 * tile + 1] = min(tm, c - s);
      tiles[3 * tile + 2] = tid;
    }
  }
  if (tid == 0) ntiles = min(warp_tiles[((e + 31) >> 5) - 1], max_tiles);
  __syncthreads();
  for (int p = tid; p < pairs; p += blockDim.x) {
    const int pos = atomicAdd(&cursor[ids[p] % e], 1);
    order[pos] = p;
  }
  for (int i = ntiles + tid; i < max_tiles; i += blockDim.x) {
    tiles[3 * i] = 0;
    tiles[3 * i + 1] = 0;
    tiles[3 * i + 2] = 0;
  }
}

extern "C" __global__ void moe_align(const uint32_t* ids, uint32_t* order, uint32_t* tiles,
                                     int pairs, int e, int tm, int max_tiles) {
  pdl_entry();
  align_pairs(ids, order, tiles, pairs, e, tm, max_tiles);
}

// Small steps (tokens <= 32): the routing and the alignment in one block of 1024 threads (warp
// w routes token w), one launch fewer a layer.
#define MOE_ROUTE_ALIGN(T, S)                                                                   \
  extern "C" __global__ void moe_route_align_##S(const T* logits, uint32_t* ids, float* w,      \
                                                 uint32_t* order, uint32_t* tiles, int tokens,  \
                                                 int e, int k, int norm, int tm,                \
                                                 int max_tiles) {                               \
    pdl_entry();                                                                                \
    moe_route<T>(logits, ids, w, tokens, e, k, norm);                                           \
    __syncthreads();                                                                            \
    align_pairs(ids, order, tiles, tokens * k, e, tm, max_tiles);                               \
  }
MOE_ROUTE_ALIGN(__nv_bfloat16, bf16)
MOE_ROUTE_ALIGN(float, f32)

namespace {

// Dot products of R weight rows (bf16: eight values a load, four loads of each row in flight
// before their FMAs) with the tile's x rows; acc[r][c] for row r and the tile's pair c.
// `rows[c]` points at pair c's input row.
template <typename T, int TM, int R>
__device__ __forceinline__ void tile_dot(const T* const* wr, const T* const* rows, int n, int len,
                                         int lane, float (*acc)[TM]) {
  if constexpr (sizeof(T) == 2) {
    constexpr int U = 4;
    for (int k0 = lane * 8; k0 < len; k0 += 32 * 8 * U) {
      uint4 wv[R][U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = k0 + u * 256;
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (k < len) wv[r][u] = *reinterpret_cast<const uint4*>(wr[r] + k);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k = k0 + u * 256;
        if (k >= len) break;
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) bf16x8_to_f32(wv[r][u], wf[r]);
#pragma unroll
        for (int c = 0; c < TM; ++c) {
          if (c < n) {
            float xv[8];
            bf16x8_to_f32(*reinterpret_cast<const uint4*>(rows[c] + k), xv);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int i = 0; i < 8; ++i) acc[r][c] += xv[i] * wf[r][i];
          }
        }
      }
    }
  } else {
    for (int k = lane; k < len; k += 32) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float wv = to_f(wr[r][k]);
#pragma unroll
        for (int c = 0; c < TM; ++c)
          if (c < n) acc[r][c] += to_f(rows[c][k]) * wv;
      }
    }
  }
}

// Grid (ceil(inter / 8), tiles), 256 threads: warp w of block (bx, tile) takes row j = bx * 8
// + w of the tile's expert's gate and of its up, for every pair of the tile. gate_up: [E_local,
// 2 * inter, hidden]; act: [P, inter] by position in `order`.
template <typename T, int TM>
__device__ void moe_gate_up(const T* __restrict__ x, const T* __restrict__ gate_up,
                            const uint32_t* __restrict__ order, const uint32_t* __restrict__ tiles,
                            T* __restrict__ act, int hidden, int inter, int k, int first,
                            int local) {
  pdl_entry();
  const MoeTile tl = moe_tile_of(tiles, first, local);
  const int start = tl.start, n = tl.n, ex = tl.ex;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int j = blockIdx.x * 8 + warp;
  if (!tl.live || j >= inter) return;
  const T* rows[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) rows[c] = x + (size_t)(order[start + min(c, n - 1)] / k) * hidden;
  const T* g = gate_up + ((size_t)ex * 2 * inter + j) * hidden;
  const T* wr[2] = {g, g + (size_t)inter * hidden};
  float acc[2][TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) acc[0][c] = acc[1][c] = 0.f;
  tile_dot<T, TM, 2>(wr, rows, n, hidden, lane, acc);
#pragma unroll
  for (int c = 0; c < TM; ++c) {
    if (c < n) {
      // As the dense path: gate and up rounded to T, then silu(gate) * up in f32.
      const float gv = to_f(from_f<T>(warp_sum(acc[0][c])));
      const float uv = to_f(from_f<T>(warp_sum(acc[1][c])));
      if (lane == 0) act[(size_t)(start + c) * inter + j] = from_f<T>(gv / (1.f + __expf(-gv)) * uv);
    }
  }
}

// Grid (ceil(hidden / (8 R)), tiles), 256 threads: warp w of block (bx, tile) takes rows o =
// (bx * 8 + w) * R .. + R of the tile's expert's down ([E_local, hidden, inter]) for every pair
// of the tile (R 4 for one-pair tiles: a down row of 768 inputs is three loads a lane, four rows
// a warp keep twelve in flight; on the H200 8.1 against 8.9 us for one token, 62 against 78 for
// eight); y: [P, hidden] by pair index, the expert's output rounded to T, times the pair's
// weight, rounded again (HF: bf16 output times bf16 weight).
template <typename T, int TM, int R = 1>
__device__ void moe_down(const T* __restrict__ act, const T* __restrict__ down,
                         const uint32_t* __restrict__ order, const uint32_t* __restrict__ tiles,
                         const float* __restrict__ w, T* __restrict__ y, int hidden, int inter,
                         int first, int local) {
  pdl_entry();
  const MoeTile tl = moe_tile_of(tiles, first, local);
  const int start = tl.start, n = tl.n, ex = tl.ex;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int o0 = (blockIdx.x * 8 + warp) * R;
  if (!tl.live || o0 >= hidden) return;
  const T* rows[TM];
#pragma unroll
  for (int c = 0; c < TM; ++c) rows[c] = act + (size_t)(start + min(c, n - 1)) * inter;
  const T* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = down + ((size_t)ex * hidden + min(o0 + r, hidden - 1)) * inter;
  float acc[R][TM];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < TM; ++c) acc[r][c] = 0.f;
  tile_dot<T, TM, R>(wr, rows, n, inter, lane, acc);
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int c = 0; c < TM; ++c) {
      if (c < n) {
        const float v = to_f(from_f<T>(warp_sum(acc[r][c])));
        if (lane == 0 && o0 + r < hidden) {
          const uint32_t pair = order[start + c];
          y[(size_t)pair * hidden + o0 + r] = from_f<T>(v * w[pair]);
        }
      }
    }
  }
}

// Grid (tokens, ceil(hidden / 256)), 256 threads: out[t] = sum of the token's pairs' y in
// ascending expert order, each add rounded to T (HF's index_add in the compute dtype); pairs on
// other ranks' experts add nothing. Thread c of block (t, bx) takes column bx * 256 + c and
// issues its pairs' loads eight at a time before the ordered adds.
template <typename T>
__device__ void moe_sum(const T* __restrict__ y, const uint32_t* __restrict__ ids,
                        T* __restrict__ out, int hidden, int k, int first, int local) {
  pdl_entry();
  const int t = blockIdx.x;
  __shared__ uint32_t sid[32];
  __shared__ int slot_order[32];
  __shared__ int live;
  if (threadIdx.x < k) sid[threadIdx.x] = ids[(size_t)t * k + threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) {
    int n = 0;
    for (int s = 0; s < k; ++s) {
      const int ex = (int)sid[s] - first;
      if (ex < 0 || ex >= local) continue;
      int at = n++;
      while (at > 0 && sid[slot_order[at - 1]] > sid[s]) {
        slot_order[at] = slot_order[at - 1];
        --at;
      }
      slot_order[at] = s;
    }
    live = n;
  }
  __syncthreads();
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= hidden) return;
  const int n = live;
  const T* yt = y + (size_t)t * k * hidden + c;
  float acc = 0.f;
  for (int i0 = 0; i0 < n; i0 += 8) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = i0 + i < n ? to_f(yt[(size_t)slot_order[i0 + i] * hidden]) : 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i0 + i < n) acc = to_f(from_f<T>(acc + v[i]));
  }
  out[(size_t)t * hidden + c] = from_f<T>(acc);
}

}  // namespace

#define MOE_KERNELS(T, S)                                                                       \
  extern "C" __global__ void moe_route_##S(const T* logits, uint32_t* ids, float* w, int tokens, \
                                           int e, int k, int norm) {                            \
    pdl_entry();                                                                                \
    moe_route<T>(logits, ids, w, tokens, e, k, norm);                                           \
  }                                                                                             \
  extern "C" __global__ void moe_sum_##S(const T* y, const uint32_t* ids, T* out, int hidden,   \
                                         int k, int first, int local) {                         \
    moe_sum<T>(y, ids, out, hidden, k, first, local);                                           \
  }
#define MOE_TILE_KERNELS(T, S, TM)                                                              \
  extern "C" __global__ void moe_gate_up_t##TM##_##S(const T* x, const T* gate_up,              \
                                                     const uint32_t* order,                     \
                                                     const uint32_t* tiles, T* act, int hidden, \
                                                     int inter, int k, int first, int local) {  \
    moe_gate_up<T, TM>(x, gate_up, order, tiles, act, hidden, inter, k, first, local);          \
  }                                                                                             \
  extern "C" __global__ void moe_down_t##TM##_##S(const T* act, const T* down,                  \
                                                  const uint32_t* order, const uint32_t* tiles, \
                                                  const float* w, T* y, int hidden, int inter,  \
                                                  int first, int local) {                       \
    moe_down<T, TM>(act, down, order, tiles, w, y, hidden, inter, first, local);                \
  }

MOE_KERNELS(__nv_bfloat16, bf16)
MOE_KERNELS(float, f32)
MOE_TILE_KERNELS(__nv_bfloat16, bf16, 8)
MOE_TILE_KERNELS(float, f32, 8)
MOE_TILE_KERNELS(float, f32, 32)

// One-pair tiles (steps of up to 64 pairs, LaunchOptions::moe_tile_one): gate|up a row pair a
// warp, down four rows a warp.
extern "C" __global__ void moe_gate_up_t1_bf16(const __nv_bfloat16* x, const __nv_bfloat16* gate_up,
                                               const uint32_t* order, const uint32_t* tiles,
                                               __nv_bfloat16* act, int hidden, int inter, int k,
                                               int first, int local) {
  moe_gate_up<__nv_bfloat16, 1>(x, gate_up, order, tiles, act, hidden, inter, k, first, local);
}
extern "C" __global__ void moe_down_t1_bf16(const __nv_bfloat16* act, const __nv_bfloat16* down,
                                            const uint32_t* order, const uint32_t* tiles,
                                            const float* w, __nv_bfloat16* y, int hidden, int inter,
                                            int first, int local) {
  moe_down<__nv_bfloat16, 1, 4>(act, down, order, tiles, w, y, hidden, inter, first, local);
}

// The add+RMSNorm in front of a sparse layer's router and the router's matmul, one launch for
// 1-2 token rows (bf16; LaunchOptions::moe_norm_router). Grid (ceil(E / 8)), 256 threads,
// T * K bf16 of dynamic shared memory (K <= 4096): every block norms the rows into shared
// memory as add_rmsnorm rounds them (bf16(res + delta), then bf16(sum * inv_rms * w)); block 0
// writes the sums to res_out (with add) and the normed rows to h (the experts' input); warp w
// of block b then takes router row b * 8 + w: logits[t][row] = bf16(h[t] . W[row]).
template <int T>
__device__ void norm_router(const __nv_bfloat16* __restrict__ W, const __nv_bfloat16* res,
                            const __nv_bfloat16* __restrict__ delta, __nv_bfloat16* res_out,
                            const __nv_bfloat16* __restrict__ nw, float eps, int add,
                            __nv_bfloat16* __restrict__ h, __nv_bfloat16* __restrict__ logits,
                            int E, int K) {
  extern __shared__ __align__(16) __nv_bfloat16 x_s[];
  __shared__ float ss[8][T];
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * 8 + warp;
  // The router's row is a weight no kernel of the step writes: its first chunks before the wait.
  const __nv_bfloat16* wr = W + (size_t)min(row, E - 1) * K;
  uint4 pre[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if ((lane + 32 * i) * 8 < K) pre[i] = *reinterpret_cast<const uint4*>(wr + (lane + 32 * i) * 8);
  pdl_wait();
  float part[T];
#pragma unroll
  for (int t = 0; t < T; ++t) part[t] = 0.f;
  for (int k = threadIdx.x; k < K; k += 256) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float v = __bfloat162float(res[(size_t)t * K + k]);
      if (add) v = __bfloat162float(__float2bfloat16(v + __bfloat162float(delta[(size_t)t * K + k])));
      x_s[t * K + k] = __float2bfloat16(v);
      part[t] += v * v;
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float v = warp_sum(part[t]);
    if (lane == 0) ss[warp][t] = v;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < K; k += 256) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float tot = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) tot += ss[i][t];
      const float inv = rsqrtf(tot / K + eps);
      const __nv_bfloat16 r = x_s[t * K + k];
      const __nv_bfloat16 x = __float2bfloat16(__bfloat162float(r) * inv * __bfloat162float(nw[k]));
      if (blockIdx.x == 0) {
        if (add) res_out[(size_t)t * K + k] = r;
        h[(size_t)t * K + k] = x;
      }
      x_s[t * K + k] = x;
    }
  }
  __syncthreads();
  if (row >= E) return;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.f;
  int i = 0;
  for (int c = lane; c * 8 < K; c += 32, ++i) {
    uint4 raw;
    if (i < 4) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (q == i) raw = pre[q];
    } else {
      raw = *reinterpret_cast<const uint4*>(wr + c * 8);
    }
    float wf[8];
    bf16x8_to_f32(raw, wf);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float xf[8];
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(x_s + t * K + c * 8), xf);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[t] = fmaf(wf[j], xf[j], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) logits[(size_t)t * E + row] = __float2bfloat16(v);
  }
}

#define MOE_NORM_ROUTER(T)                                                                      \
  extern "C" __global__ void __launch_bounds__(256) moe_norm_router_t##T(                       \
      const __nv_bfloat16* W, const __nv_bfloat16* res, const __nv_bfloat16* delta,             \
      __nv_bfloat16* res_out, const __nv_bfloat16* nw, float eps, int add, __nv_bfloat16* h,    \
      __nv_bfloat16* logits, int E, int K) {                                                    \
    norm_router<T>(W, res, delta, res_out, nw, eps, add, h, logits, E, K);                      \
  }
MOE_NORM_ROUTER(1)
MOE_NORM_ROUTER(2)
