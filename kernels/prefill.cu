// Prefill attention over the paged caches: CUDA cores (any dtype) and tensor cores (bf16).

#include "attention.cuh"

namespace {

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

#define PS_PREFILL(T, NAME, G)                                                                   \
  extern "C" __global__ void __launch_bounds__(THREADS)                                         \
      paged_prefill_g##G##_##NAME(const PrefillParams p) {                                      \
    pdl_entry();                                                                                \
    paged_prefill<T, G>((const T*)p.q, (const T*)p.k_cache, (const T*)p.v_cache, p.tiles,       \
                        p.seq_meta, p.tables, (T*)p.out, p.block_size, p.num_slots, p.nkv);     \
  }

PS_PREFILL(__nv_bfloat16, bf16, 1)
PS_PREFILL(__nv_bfloat16, bf16, 2)
PS_PREFILL(__nv_bfloat16, bf16, 4)
PS_PREFILL(float, f32, 1)
PS_PREFILL(float, f32, 2)
PS_PREFILL(float, f32, 4)

// Four blocks per SM (at most 128 registers a thread), as the kernel had with positional
// arguments: with the parameter struct ptxas took 130 registers and three blocks per SM, and
// an 8k-token prefill of 0.6B ran 12% slower on the H200 (BENCHMARKS.md, "Rooms").
constexpr int TC_MIN_BLOCKS = 4;

#define PS_PREFILL_TC(G)                                                                         \
  extern "C" __global__ void __launch_bounds__(THREADS, TC_MIN_BLOCKS)                          \
      paged_prefill_tc_g##G##_bf16(const PrefillParams p) {                                     \
    pdl_entry();                                                                                \
    paged_prefill_tc<G>((const __nv_bfloat16*)p.q, (const __nv_bfloat16*)p.k_cache,             \
                        (const __nv_bfloat16*)p.v_cache, p.tiles, p.seq_meta, p.tables,         \
                        (__nv_bfloat16*)p.out, p.block_size, p.num_slots, p.nkv);               \
  }
PS_PREFILL_TC(1)
PS_PREFILL_TC(2)
PS_PREFILL_TC(4)
PS_PREFILL_TC(8)
