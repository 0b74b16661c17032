// Paged attention for decode steps (one query token per sequence), flash-decoding style.
//
// q [B, nh, hd] (already scaled by 1/sqrt(hd)); the K/V caches are head-major
// [nkv, num_slots, hd]; sequence b's token p sits in slot
// block_tables[b * W + p / block_size] * block_size + p % block_size.
//
// Grid (B, nkv, splits): a block takes one sequence, one KV head and one partition of PART
// context tokens, and serves every query head of that KV head's group (GQA: each K/V row is
// read once for the G query heads). Inside, each half-warp takes one token at a time (a lane
// holds 8 of the 128 dims, a 16-byte load), with an online softmax in f32 per query head;
// the 8 half-warps are merged through shared memory. With one partition the block writes the
// output; otherwise it writes its max, sum and unnormalized accumulator and a second kernel
// merges the partitions. The number of partitions is the grid's, not the context lengths';
// a graph captures a fixed number and each sequence's partitions grow to cover its context,
// those past its end writing an empty partial. The table row width comes as an argument, or,
// for a captured graph, from device memory (`width`), so one graph serves any width.

#include <cuda_bf16.h>
#include <mma.h>
#include <stdint.h>

#include "common.cuh"

namespace {

constexpr int HD = 128;
constexpr int LANES = 16;          // lanes per token
constexpr int PER = HD / LANES;    // dims per lane (8)
constexpr int THREADS = 128;
constexpr int GROUPS = THREADS / LANES;  // half-warps per block (8)

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* out) {
  uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ void load8(const float* p, float* out) {
  float4 a = reinterpret_cast<const float4*>(p)[0];
  float4 b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

// Tokens per partition of a context of ctx tokens in `splits` partitions of at least part_min
// tokens (a multiple of 16); the decode kernel and its reduce agree on it.
__device__ __forceinline__ int decode_part(int ctx, int splits, int part_min) {
  return max(part_min, (((ctx + splits - 1) / splits) + 15) & ~15);
}

template <typename T, int G>
__device__ void paged_decode(const T* __restrict__ q, const T* __restrict__ k_cache,
                             const T* __restrict__ v_cache,
                             const uint32_t* __restrict__ block_tables,
                             const uint32_t* __restrict__ ctx_lens, T* __restrict__ out,
                             float* __restrict__ part_acc, float* __restrict__ part_ml, int W,
                             const uint32_t* __restrict__ width, int block_size,
                             long long num_slots, int nkv, int part_min) {
  const int b = blockIdx.x, kh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int nh = nkv * G;
  const int ctx = (int)ctx_lens[b];
  if (width != nullptr) W = (int)*width;
  // A partition is part_min tokens, or longer when the fixed number of partitions (a captured
  // graph's grid) would not cover the context otherwise.
  const int part = decode_part(ctx, splits, part_min);
  const int start = split * part;
  // A partition past the context: the reduce reads none of it (one partition still writes
  // the output, zeros for an empty context).
  if (splits > 1 && start >= ctx) return;
  const int end = min(ctx, start + part);
  const int grp = threadIdx.x / LANES, lane = threadIdx.x % LANES;

  float qv[G][PER];
#pragma unroll
  for (int g = 0; g < G; ++g) load8(q + ((size_t)b * nh + kh * G + g) * HD + lane * PER, qv[g]);

  float m[G], l[G], acc[G][PER];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i) acc[g][i] = 0.f;
  }
  const uint32_t* table = block_tables + (size_t)b * W;
  const size_t head_base = (size_t)kh * num_slots;
  // Both half-warps of a warp run the same number of iterations (the shuffles below need the
  // whole warp); a half-warp past the end computes nothing and keeps its state.
  for (int base = start + (grp & ~1); base < end; base += GROUPS) {
    const int p = base + (grp & 1);
    const bool valid = p < end;
    float kv[PER];
    size_t off = 0;
    if (valid) {
      size_t slot = (size_t)table[p / block_size] * block_size + p % block_size;
      off = (head_base + slot) * HD + lane * PER;
      load8(k_cache + off, kv);
    } else {
#pragma unroll
      for (int i = 0; i < PER; ++i) kv[i] = 0.f;
    }
    float s[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float d = 0.f;
#pragma unroll
      for (int i = 0; i < PER; ++i) d += qv[g][i] * kv[i];
#pragma unroll
      for (int o = LANES / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o, LANES);
      s[g] = d;
    }
    if (!valid) continue;
    load8(v_cache + off, kv);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mn = fmaxf(m[g], s[g]);
      float scale = __expf(m[g] - mn);
      float e = __expf(s[g] - mn);
      l[g] = l[g] * scale + e;
#pragma unroll
      for (int i = 0; i < PER; ++i) acc[g][i] = acc[g][i] * scale + e * kv[i];
      m[g] = mn;
    }
  }

  // Merge the half-warps: [GROUPS][G] max/sum, [GROUPS][G][HD] accumulators.
  __shared__ float sm[GROUPS][G], sl[GROUPS][G];
  __shared__ float sacc[GROUPS][G][HD];
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) { sm[grp][g] = m[g]; sl[grp][g] = l[g]; }
  }
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int i = 0; i < PER; ++i) sacc[grp][g][lane * PER + i] = acc[g][i];
  __syncthreads();
  // Thread t merges dim t % HD of head t / HD (G * HD outputs, THREADS threads).
  for (int idx = threadIdx.x; idx < G * HD; idx += THREADS) {
    int g = idx / HD, d = idx % HD;
    float M = -INFINITY;
#pragma unroll
    for (int k = 0; k < GROUPS; ++k) M = fmaxf(M, sm[k][g]);
    float L = 0.f, A = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int k = 0; k < GROUPS; ++k) {
        float w = __expf(sm[k][g] - M);
        L += sl[k][g] * w;
        A += sacc[k][g][d] * w;
      }
    }
    int h = kh * G + g;
    if (splits == 1) {
      T* o = out + ((size_t)b * nh + h) * HD + d;
      float v = L > 0.f ? A / L : 0.f;
      *o = (T)v;
    } else {
      size_t pi = ((size_t)b * nh + h) * splits + split;
      part_acc[pi * HD + d] = A;
      if (d == 0) { part_ml[pi * 2] = M; part_ml[pi * 2 + 1] = L; }
    }
  }
}

// Merges the partitions of paged_decode that hold context: grid (B, nh), HD threads.
template <typename T>
__device__ void paged_decode_reduce(const float* __restrict__ part_acc,
                                    const float* __restrict__ part_ml,
                                    const uint32_t* __restrict__ ctx_lens, T* __restrict__ out,
                                    int splits, int part_min) {
  const int b = blockIdx.x, h = blockIdx.y, nh = gridDim.y, d = threadIdx.x;
  const int ctx = (int)ctx_lens[b];
  const int part = decode_part(ctx, splits, part_min);
  const int used = ctx > 0 ? min(splits, (ctx + part - 1) / part) : 0;
  size_t base = ((size_t)b * nh + h) * splits;
  float M = -INFINITY;
  for (int s = 0; s < used; ++s) M = fmaxf(M, part_ml[(base + s) * 2]);
  float L = 0.f, A = 0.f;
  if (M != -INFINITY) {
    for (int s = 0; s < used; ++s) {
      float w = __expf(part_ml[(base + s) * 2] - M);
      L += part_ml[(base + s) * 2 + 1] * w;
      A += part_acc[(base + s) * HD + d] * w;
    }
  }
  out[((size_t)b * nh + h) * HD + d] = (T)(L > 0.f ? A / L : 0.f);
}

// Varlen causal attention of prefill chunks over the paged caches (CUDA cores, f32 math).
// A block takes BQ query tokens of one sequence and one KV head, i.e. BQ * G query rows, and
// walks the keys of the sequence up to its last query token in chunks of BK tokens staged in
// shared memory (read through the block table), with an online softmax per row: no score
// matrix is stored, so memory stays bounded for any prompt length. TPR = THREADS / (BQ * G)
// threads share a row, each holding HD / TPR dims.
//   tiles    [num_tiles * 2]: (prefill sequence, first query token of the tile)
//   seq_meta [S * 4]: (first row of the sequence in q/out, new tokens, context length,
//                      offset of its block table in `tables`)
constexpr int BQ = 16;
constexpr int BK = 32;

template <typename T, int G>
__device__ void paged_prefill(const T* __restrict__ q, const T* __restrict__ k_cache,
                              const T* __restrict__ v_cache, const uint32_t* __restrict__ tiles,
                              const uint32_t* __restrict__ seq_meta,
                              const uint32_t* __restrict__ tables, T* __restrict__ out,
                              int block_size, long long num_slots, int nkv) {
  constexpr int ROWS = BQ * G;
  constexpr int TPR = THREADS / ROWS;
  constexpr int DPT = HD / TPR;
  const int tile = blockIdx.x, kh = blockIdx.y, nh = nkv * G;
  const uint32_t seq = tiles[2 * tile], q_off = tiles[2 * tile + 1];
  const uint32_t row0 = seq_meta[4 * seq], q_len = seq_meta[4 * seq + 1];
  const uint32_t ctx = seq_meta[4 * seq + 2];
  const uint32_t* table = tables + seq_meta[4 * seq + 3];
  const int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
  const int i = r / G, g = r % G;
  const bool valid = q_off + i < q_len;
  const int q_pos = (int)(ctx - q_len + q_off + i);  // absolute position of this query
  const int h = kh * G + g;
  const int d0 = part * DPT;
  float qv[DPT], acc[DPT];
  if (valid) {
    const T* qp = q + ((size_t)(row0 + q_off + i) * nh + h) * HD + d0;
#pragma unroll
    for (int d = 0; d < DPT; d += PER) load8(qp + d, qv + d);
  } else {
#pragma unroll
    for (int d = 0; d < DPT; ++d) qv[d] = 0.f;
  }
#pragma unroll
  for (int d = 0; d < DPT; ++d) acc[d] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int last = min((int)q_len, (int)q_off + BQ) - 1;
  const int kend = (int)(ctx - q_len) + last + 1;  // keys this tile needs
  __shared__ __align__(16) T ks[BK][HD];
  __shared__ __align__(16) T vs[BK][HD];
  const size_t head_base = (size_t)kh * num_slots;
  for (int c0 = 0; c0 < kend; c0 += BK) {
    const int n = min(BK, kend - c0);
    // Stage K/V rows c0 .. c0 + n: 8 elements (16 bytes for bf16) per thread and step.
    for (int e = threadIdx.x; e < n * (HD / PER); e += THREADS) {
      int j = e / (HD / PER), d = (e % (HD / PER)) * PER;
      int p = c0 + j;
      size_t slot = (size_t)table[p / block_size] * block_size + p % block_size;
      size_t off = (head_base + slot) * HD + d;
      if (sizeof(T) == 2) {
        *reinterpret_cast<uint4*>(&ks[j][d]) = *reinterpret_cast<const uint4*>(k_cache + off);
        *reinterpret_cast<uint4*>(&vs[j][d]) = *reinterpret_cast<const uint4*>(v_cache + off);
      } else {
#pragma unroll
        for (int x = 0; x < PER; ++x) {
          ks[j][d + x] = k_cache[off + x];
          vs[j][d + x] = v_cache[off + x];
        }
      }
    }
    __syncthreads();
    for (int j = 0; j < n; ++j) {
      float s = 0.f;
#pragma unroll
      for (int d = 0; d < DPT; ++d) s += qv[d] * (float)ks[j][d0 + d];
#pragma unroll
      for (int o = TPR / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o, TPR);
      if (valid && c0 + j <= q_pos) {
        float mn = fmaxf(m, s);
        float scale = __expf(m - mn);
        float e = __expf(s - mn);
        l = l * scale + e;
#pragma unroll
        for (int d = 0; d < DPT; ++d) acc[d] = acc[d] * scale + e * (float)vs[j][d0 + d];
        m = mn;
      }
    }
    __syncthreads();
  }
  if (valid) {
    T* op = out + ((size_t)(row0 + q_off + i) * nh + h) * HD + d0;
    float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int d = 0; d < DPT; ++d) op[d] = (T)(acc[d] * inv);
  }
}

// Prefill attention on tensor cores (bf16 WMMA 16x16x16, f32 accumulation), for bf16 models.
// A block of 4 warps takes TC_ROWS = 64 query rows (TC_ROWS / G tokens of one sequence, the G
// query heads of one KV head); each warp owns 16 rows. Two passes over the keys (chunks of
// TC_BK staged in shared memory through the block table): the first finds each row's max and
// softmax denominator, the second accumulates P V with P already normalized, so the
// accumulators never need rescaling. Memory stays bounded for any prompt length.
constexpr int TC_ROWS = 64;
constexpr int TC_BK = 32;

template <int G>
__device__ void paged_prefill_tc(const __nv_bfloat16* __restrict__ q,
                                 const __nv_bfloat16* __restrict__ k_cache,
                                 const __nv_bfloat16* __restrict__ v_cache,
                                 const uint32_t* __restrict__ tiles,
                                 const uint32_t* __restrict__ seq_meta,
                                 const uint32_t* __restrict__ tables,
                                 __nv_bfloat16* __restrict__ out, int block_size,
                                 long long num_slots, int nkv) {
  using namespace nvcuda;
  constexpr int TOK = TC_ROWS / G;
  const int tile = blockIdx.x, kh = blockIdx.y, nh = nkv * G;
  const uint32_t seq = tiles[2 * tile], q_off = tiles[2 * tile + 1];
  const uint32_t row0 = seq_meta[4 * seq], q_len = seq_meta[4 * seq + 1];
  const uint32_t ctx = seq_meta[4 * seq + 2];
  const uint32_t* table = tables + seq_meta[4 * seq + 3];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ __align__(32) __nv_bfloat16 qs[TC_ROWS][HD];
  __shared__ __align__(32) __nv_bfloat16 ks[TC_BK][HD];
  __shared__ __align__(32) __nv_bfloat16 vs[TC_BK][HD];
  __shared__ __align__(32) float ss[4][16][TC_BK];
  __shared__ __align__(32) __nv_bfloat16 ps[4][16][TC_BK];

  // Query rows r = token * G + head, zeros for tokens past the chunk.
  for (int e = threadIdx.x; e < TC_ROWS * HD / 8; e += THREADS) {
    int r = e / (HD / 8), d = (e % (HD / 8)) * 8;
    int i = r / G, g = r % G;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (q_off + i < q_len)
      v = *reinterpret_cast<const uint4*>(q + ((size_t)(row0 + q_off + i) * nh + kh * G + g) * HD + d);
    *reinterpret_cast<uint4*>(&qs[r][d]) = v;
  }
  // This lane's row (two lanes per row, each half of a key chunk).
  const int row = lane / 2, half = lane % 2;
  const int rb = warp * 16 + row;
  const int ti = rb / G;
  const bool rvalid = q_off + ti < q_len;
  const int qpos = (int)(ctx - q_len + q_off + ti);
  const int last = min((int)q_len, (int)q_off + TOK) - 1;
  const int kend = (int)(ctx - q_len) + last + 1;
  const size_t head_base = (size_t)kh * num_slots;

  auto stage = [&](int c0, int n, bool with_v) {
    for (int e = threadIdx.x; e < TC_BK * (HD / 8); e += THREADS) {
      int j = e / (HD / 8), d = (e % (HD / 8)) * 8;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (j < n) {
        int p = c0 + j;
        size_t slot = (size_t)table[p / block_size] * block_size + p % block_size;
        size_t off = (head_base + slot) * HD + d;
        kv = *reinterpret_cast<const uint4*>(k_cache + off);
        if (with_v) vv = *reinterpret_cast<const uint4*>(v_cache + off);
      }
      *reinterpret_cast<uint4*>(&ks[j][d]) = kv;
      if (with_v) *reinterpret_cast<uint4*>(&vs[j][d]) = vv;
    }
  };
  // S = Q_w K^T for this warp's 16 rows and the chunk's TC_BK keys, into ss[warp].
  auto scores = [&]() {
#pragma unroll
    for (int nf = 0; nf < TC_BK / 16; ++nf) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(a, &qs[warp * 16][kk * 16], HD);
        wmma::load_matrix_sync(b, &ks[nf * 16][kk * 16], HD);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(&ss[warp][0][nf * 16], acc, TC_BK, wmma::mem_row_major);
    }
    __syncwarp();
  };

  float m = -INFINITY, l = 0.f;
  for (int c0 = 0; c0 < kend; c0 += TC_BK) {
    const int n = min(TC_BK, kend - c0);
    stage(c0, n, false);
    __syncthreads();
    scores();
    float cm = -INFINITY;
    for (int j = half * 16; j < half * 16 + 16; ++j)
      if (rvalid && j < n && c0 + j <= qpos) cm = fmaxf(cm, ss[warp][row][j]);
    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
    float mn = fmaxf(m, cm);
    float sum = 0.f;
    if (mn != -INFINITY)
      for (int j = half * 16; j < half * 16 + 16; ++j)
        if (rvalid && j < n && c0 + j <= qpos) sum += __expf(ss[warp][row][j] - mn);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = (m == -INFINITY ? 0.f : l * __expf(m - mn)) + sum;
    m = mn;
    __syncthreads();
  }
  const float inv_l = l > 0.f ? 1.f / l : 0.f;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[HD / 16];
#pragma unroll
  for (int nf = 0; nf < HD / 16; ++nf) wmma::fill_fragment(o[nf], 0.f);
  for (int c0 = 0; c0 < kend; c0 += TC_BK) {
    const int n = min(TC_BK, kend - c0);
    stage(c0, n, true);
    __syncthreads();
    scores();
    // P = P_hi + P_lo, both bf16: two products keep ~16 bits of P (torch's bf16 attention
    // keeps 8), so the output is as accurate as an f32 P V.
    float lo[16];
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      int j = half * 16 + jj;
      bool ok = rvalid && j < n && c0 + j <= qpos;
      float p = ok ? __expf(ss[warp][row][j] - m) * inv_l : 0.f;
      __nv_bfloat16 hi = __float2bfloat16(p);
      ps[warp][row][j] = hi;
      lo[jj] = p - __bfloat162float(hi);
    }
#pragma unroll
    for (int part = 0; part < 2; ++part) {
      __syncwarp();
#pragma unroll
      for (int kk = 0; kk < TC_BK / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, &ps[warp][0][kk * 16], TC_BK);
#pragma unroll
        for (int nf = 0; nf < HD / 16; ++nf) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
          wmma::load_matrix_sync(b, &vs[kk * 16][nf * 16], HD);
          wmma::mma_sync(o[nf], a, b, o[nf]);
        }
      }
      __syncwarp();
      if (part == 0) {
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) ps[warp][row][half * 16 + jj] = __float2bfloat16(lo[jj]);
      }
    }
    __syncthreads();
  }
  // Out: two 16x16 fragments at a time through ss[warp] (16 x 32 floats).
#pragma unroll
  for (int pair = 0; pair < HD / 32; ++pair) {
    wmma::store_matrix_sync(&ss[warp][0][0], o[2 * pair], TC_BK, wmma::mem_row_major);
    wmma::store_matrix_sync(&ss[warp][0][16], o[2 * pair + 1], TC_BK, wmma::mem_row_major);
    __syncwarp();
    if (rvalid) {
      int g = rb % G;
      __nv_bfloat16* op = out + ((size_t)(row0 + q_off + ti) * nh + kh * G + g) * HD + pair * 32;
      for (int j = half * 16; j < half * 16 + 16; ++j) op[j] = __float2bfloat16(ss[warp][row][j]);
    }
    __syncwarp();
  }
}

}  // namespace

#define PS_DECODE(T, NAME, G)                                                                    \
  extern "C" __global__ void __launch_bounds__(THREADS) paged_decode_g##G##_##NAME(            \
      const T* q, const T* k_cache, const T* v_cache, const uint32_t* block_tables,             \
      const uint32_t* ctx_lens, T* out, float* part_acc, float* part_ml, int W,                 \
      const uint32_t* width, int block_size, long long num_slots, int nkv, int part) { pdl_entry();          \
    paged_decode<T, G>(q, k_cache, v_cache, block_tables, ctx_lens, out, part_acc, part_ml, W,  \
                       width, block_size, num_slots, nkv, part);                                \
  }

#define PS_PREFILL(T, NAME, G)                                                                   \
  extern "C" __global__ void __launch_bounds__(THREADS) paged_prefill_g##G##_##NAME(           \
      const T* q, const T* k_cache, const T* v_cache, const uint32_t* tiles,                    \
      const uint32_t* seq_meta, const uint32_t* tables, T* out, int block_size,                 \
      long long num_slots, int nkv) { pdl_entry();                                                           \
    paged_prefill<T, G>(q, k_cache, v_cache, tiles, seq_meta, tables, out, block_size,          \
                        num_slots, nkv);                                                        \
  }

#define PS_ATTENTION(T, NAME)                                                                    \
  PS_PREFILL(T, NAME, 1)                                                                         \
  PS_PREFILL(T, NAME, 2)                                                                         \
  PS_PREFILL(T, NAME, 4)                                                                         \
  PS_DECODE(T, NAME, 1)                                                                          \
  PS_DECODE(T, NAME, 2)                                                                          \
  PS_DECODE(T, NAME, 4)                                                                          \
  PS_DECODE(T, NAME, 8)                                                                          \
  extern "C" __global__ void paged_decode_reduce_##NAME(                                        \
      const float* part_acc, const float* part_ml, const uint32_t* ctx_lens, T* out, int splits, \
      int part_min) { pdl_entry();                                                                           \
    paged_decode_reduce<T>(part_acc, part_ml, ctx_lens, out, splits, part_min);                 \
  }

PS_ATTENTION(__nv_bfloat16, bf16)

#define PS_PREFILL_TC(G)                                                                         \
  extern "C" __global__ void __launch_bounds__(THREADS) paged_prefill_tc_g##G##_bf16(          \
      const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,       \
      const uint32_t* tiles, const uint32_t* seq_meta, const uint32_t* tables,                  \
      __nv_bfloat16* out, int block_size, long long num_slots, int nkv) { pdl_entry();                       \
    paged_prefill_tc<G>(q, k_cache, v_cache, tiles, seq_meta, tables, out, block_size,          \
                        num_slots, nkv);                                                        \
  }
PS_PREFILL_TC(1)
PS_PREFILL_TC(2)
PS_PREFILL_TC(4)
PS_PREFILL_TC(8)
PS_ATTENTION(float, f32)
