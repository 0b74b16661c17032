// The tensor-core decode attention's pieces, shared by paged_decode_mma (decode_mma.cu) and
// the fused decode attention's tensor-core loop (fused_decode.cu, LaunchOptions::fused_mma):
// the MMAs, where a lane's 16-byte pieces of K and V rows lie, the chunk stages and the online
// softmax of one chunk (decode_mma.cu's opening comment says how the pieces fit).
#pragma once

#include "flash.cuh"

namespace {

constexpr int MMA_WARPS = 4;
constexpr int CHUNK = 16;
constexpr float LN2 = 0.6931471805599453f;

// d += a (16x16) * b (16x8).
template <bool F16>
__device__ __forceinline__ void mma_full(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (F16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// d += a (16x16; rows 8..15 zero: a1 = a3 = 0) * b (16x8).
template <bool F16>
__device__ __forceinline__ void mma_rows8(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                          uint32_t b1) {
  const uint32_t a[4] = {a0, 0u, a2, 0u};
  mma_full<F16>(d, a, b0, b1);
}

template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (F16) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    return pack_bf16(lo, hi);
  }
}

// Two e4m3 (the low 16 bits of x) as an f16 pair, exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(x & 0xffffu), __NV_E4M3);
  return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

// Where a lane's 16-byte pieces of a K or V row lie, and how the MMA fragments come from them.
template <typename KT>
struct MmaKv;

// bf16 caches: a lane loads 4 pieces (32 dims) of each of its two keys and 2 (16 dims) of each
// of its four values; piece i of lane t's key starts at dim (4i + t) * 8, so the four lanes of
// a token read 64 consecutive bytes a load.
template <>
struct MmaKv<__nv_bfloat16> {
  static constexpr bool F16 = false;
  static constexpr int KU = 4, VU = 2, PIECES = 16;
  __device__ static int k_off(int t, int i) { return (i * 4 + t) * 8; }
  __device__ static int v_off(int n, int i) { return (i * 8 + n) * 8; }
  // First dim of the lane's pair j (0..15) of key dims; k-step kk takes pairs 2kk and 2kk+1.
  __device__ static int k_pair(int t, int j) { return k_off(t, j / 4) + 2 * (j % 4); }
  // The dim of Vᵀ's row n + 8 hi (n 0..7) of tile mt (0..7).
  __device__ static int v_dim(int n, int mt, int hi) { return v_off(n, mt / 4) + 2 * (mt % 4) + hi; }
  __device__ static void k_frags(const uint4 (&r)[KU], uint32_t (&b)[16]) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(r);
#pragma unroll
    for (int j = 0; j < 16; ++j) b[j] = w[j];
  }
  // For every tile mt: (x, y) at v_dim(n, mt, 0) into lo[mt], at v_dim(n, mt, 1) into hi[mt]
  // (tokens x and y's values, x in the low half).
  __device__ static void v_frags(const uint4 (&x)[VU], const uint4 (&y)[VU], uint32_t (&lo)[8],
                                 uint32_t (&hi)[8]) {
    const uint32_t* a = reinterpret_cast<const uint32_t*>(x);
    const uint32_t* c = reinterpret_cast<const uint32_t*>(y);
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      lo[mt] = __byte_perm(a[mt], c[mt], 0x5410);
      hi[mt] = __byte_perm(a[mt], c[mt], 0x7632);
    }
  }
};

// fp8 caches: 2 pieces (32 dims) of each key, 1 (16 dims) of each value; piece i of lane t's
// key starts at dim (4i + t) * 16.
template <>
struct MmaKv<fp8> {
  static constexpr bool F16 = true;
  static constexpr int KU = 2, VU = 1, PIECES = 8;
  __device__ static int k_off(int t, int i) { return (i * 4 + t) * 16; }
  __device__ static int v_off(int n, int) { return n * 16; }
  __device__ static int k_pair(int t, int j) { return k_off(t, j / 8) + 2 * (j % 8); }
  __device__ static int v_dim(int n, int mt, int hi) { return n * 16 + 2 * mt + hi; }
  __device__ static void k_frags(const uint4 (&r)[KU], uint32_t (&b)[16]) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(r);
#pragma unroll
    for (int j = 0; j < 16; ++j) b[j] = e4m3x2_to_f16x2(w[j / 2] >> (16 * (j % 2)));
  }
  __device__ static void v_frags(const uint4 (&x)[VU], const uint4 (&y)[VU], uint32_t (&lo)[8],
                                 uint32_t (&hi)[8]) {
    const uint32_t* a = reinterpret_cast<const uint32_t*>(x);
    const uint32_t* c = reinterpret_cast<const uint32_t*>(y);
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      // Bytes (x[2mt], y[2mt], x[2mt+1], y[2mt+1]).
      const uint32_t pr = __byte_perm(a[mt / 2], c[mt / 2], mt % 2 ? 0x7362 : 0x5140);
      lo[mt] = e4m3x2_to_f16x2(pr);
      hi[mt] = e4m3x2_to_f16x2(pr >> 16);
    }
  }
};

// Where the chunk at `base` lives: the slot of its first token when the whole chunk sits in one
// block (power-of-two block sizes of 16 and more, partitions starting at multiples of 16, as
// decode_part makes them), else -1 (each token's slot from the table).
struct MmaTable {
  const uint32_t* table;
  int bs, shift;
  bool fast;
  __device__ __forceinline__ long long chunk_slot(int base) const {
    if (!fast) return -1;
    return ((long long)table[base >> shift] << shift) + (base & (bs - 1));
  }
  __device__ __forceinline__ size_t slot(long long first, int base, int p) const {
    if (first >= 0) return (size_t)(first + (p - base));
    return (size_t)table[p / bs] * bs + p % bs;
  }
};

// The table of a partition starting at `start` (MmaTable::fast where its chunks may use it).
__device__ __forceinline__ MmaTable mma_table(const uint32_t* table, int bs, int start) {
  MmaTable tb;
  tb.table = table;
  tb.bs = bs;
  tb.shift = __ffs(bs) - 1;
  tb.fast = bs >= CHUNK && (bs & (bs - 1)) == 0 && start % CHUNK == 0;
  return tb;
}

// Chunks of 16 tokens in the partition [start, end) (none when it is empty).
__device__ __forceinline__ int mma_chunks(int start, int end) {
  return end > start ? (end - start + CHUNK - 1) / CHUNK : 0;
}

// A stage: the chunk's 16 K rows, then its 16 V rows, each row's 16-byte piece p stored at
// piece p ^ swizzle(row): K rows alternate halves (a fragment read takes two rows at the same
// pieces), V rows shift by pairs (it takes four rows at two pieces).
__device__ __forceinline__ int k_phys(int r, int p) { return p ^ ((r & 1) << 2); }
__device__ __forceinline__ int v_phys(int r, int p) { return p ^ (((r >> 1) & 3) << 1); }
template <typename KT>
__host__ __device__ constexpr int stage_bytes() {
  return 2 * CHUNK * MmaKv<KT>::PIECES * 16;
}

// The warp copies the chunk at `base` into stage `st` (rows past `end` as zeros: no NaN of an
// unwritten slot reaches the MMAs).
template <typename KT>
__device__ __forceinline__ void stage_load(unsigned char* st, const KT* __restrict__ kc,
                                           const KT* __restrict__ vc, const MmaTable& tb,
                                           size_t head_base, int base, int end, int lane) {
  constexpr int P = MmaKv<KT>::PIECES, ROWB = P * 16, PER = CHUNK * P / 32;
  const long long first = tb.chunk_slot(base);
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int idx = lane + 32 * j, r = idx / P, pc = idx % P, p = base + r;
    const bool valid = p < end;
    const size_t row = valid ? (head_base + tb.slot(first, base, p)) * HD : 0;
    cp_async16(smem_addr(st + r * ROWB + k_phys(r, pc) * 16),
               reinterpret_cast<const unsigned char*>(kc + row) + pc * 16, valid);
    cp_async16(smem_addr(st + (CHUNK + r) * ROWB + v_phys(r, pc) * 16),
               reinterpret_cast<const unsigned char*>(vc + row) + pc * 16, valid);
  }
}

// Row r of a stage's K and V from k and v (HD elements each, 16-byte aligned): a piece a lane
// (the caller synchronizes the warp after).
template <typename KT>
__device__ __forceinline__ void stage_put_row(unsigned char* st, int r, const KT* k, const KT* v,
                                              int lane) {
  constexpr int P = MmaKv<KT>::PIECES, ROWB = P * 16;
  if (lane < 2 * P) {
    const bool isv = lane >= P;
    const int pc = lane % P;
    const uint4 x = reinterpret_cast<const uint4*>(isv ? v : k)[pc];
    *reinterpret_cast<uint4*>(st + (isv ? (CHUNK + r) * ROWB + v_phys(r, pc) * 16
                                        : r * ROWB + k_phys(r, pc) * 16)) = x;
  }
}

// A warp's online-softmax state: head gr's running max (log2 units) and this lane's share of
// its sum, and Oᵀ's tiles: acc[mt] holds heads 2t, 2t + 1 at v_dim(gr, mt, 0) (0, 1) and at
// v_dim(gr, mt, 1) (2, 3).
struct MmaState {
  float m, l;
  float acc[8][4];
};

// LATE_V: the V rows read from the stage after the scores (32 registers fewer while they
// are formed; the fused kernel's tensor-core loop, which must fit 128 a thread).
// One chunk into the state: scores (times sc: K's scale and log2 e), the chunk's max over the
// quad, rescaling only when some row's max moved, then P V. SPLIT (bf16 only): P goes through
// the MMA as a bf16 pair, its high part and the remainder.
template <typename KT, bool SPLIT, bool LATE_V = false>
__device__ __forceinline__ void mma_chunk(const unsigned char* stg, const uint32_t (&qa)[16],
                                          float sc, int base, int end, int gr, int t,
                                          MmaState& st) {
  using L = MmaKv<KT>;
  constexpr bool F16 = L::F16;
  constexpr int ROWB = L::PIECES * 16;
  // Keys of tokens gr and 8 + gr at pieces 4i + t; values of tokens 2t, 2t+1, 8+2t, 9+2t at
  // pieces 8i + gr.
  uint4 kr[2][L::KU], vr[4][L::VU];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < L::KU; ++i) {
      const int r = 8 * h + gr;
      kr[h][i] = *reinterpret_cast<const uint4*>(stg + r * ROWB + k_phys(r, 4 * i + t) * 16);
    }
  auto load_v = [&]() {
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int i = 0; i < L::VU; ++i) {
        const int r = 2 * t + (u & 1) + 8 * (u >> 1);
        vr[u][i] = *reinterpret_cast<const uint4*>(stg + (CHUNK + r) * ROWB +
                                                   v_phys(r, 8 * i + gr) * 16);
      }
  };
  if constexpr (!LATE_V) load_v();
  float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
  {
    uint32_t k0[16], k1[16];
    L::k_frags(kr[0], k0);
    L::k_frags(kr[1], k1);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      mma_rows8<F16>(s0, qa[2 * kk], qa[2 * kk + 1], k0[2 * kk], k0[2 * kk + 1]);
      mma_rows8<F16>(s1, qa[2 * kk], qa[2 * kk + 1], k1[2 * kk], k1[2 * kk + 1]);
    }
  }
  float sv[4] = {s0[0], s0[1], s1[0], s1[1]};
  float cm = -INFINITY;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int p = base + 2 * t + (u & 1) + 8 * (u >> 1);
    sv[u] = p < end ? sv[u] * sc : -INFINITY;
    cm = fmaxf(cm, sv[u]);
  }
  cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
  cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 2));
  // The chunk's first token is inside the partition: mn is finite.
  const float mn = fmaxf(st.m, cm);
  const float alpha = fast_exp2(st.m - mn);
  float pv[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) pv[u] = fast_exp2(sv[u] - mn);
  st.l = st.l * alpha + ((pv[0] + pv[1]) + (pv[2] + pv[3]));
  st.m = mn;
  if (__any_sync(0xffffffffu, alpha != 1.f)) {
    // Oᵀ's columns are heads 2t and 2t + 1, whose factors lanes 8t and 8t + 4 computed.
    const float a0 = __shfl_sync(0xffffffffu, alpha, 8 * t);
    const float a1 = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      st.acc[mt][0] *= a0;
      st.acc[mt][1] *= a1;
      st.acc[mt][2] *= a0;
      st.acc[mt][3] *= a1;
    }
  }
  // Pᵀ's fragment is S's accumulator as this lane holds it: tokens 2t, 2t + 1 (and 8 + 2t,
  // 9 + 2t) of head gr.
  const uint32_t pb0 = pack2<F16>(pv[0], pv[1]), pb1 = pack2<F16>(pv[2], pv[3]);
  // bf16 keeps 8 bits of P (2e-3 from the f32 attention in the norm on the H200, the
  // CUDA-core kernel 1.9e-4); with SPLIT, P's remainder goes through a second MMA, which
  // leaves ~16 bits. f16's 11 bits need none.
  uint32_t pl0 = 0, pl1 = 0;
  if constexpr (SPLIT && !F16) {
    const float2 h0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pb0));
    const float2 h1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pb1));
    pl0 = pack2<false>(pv[0] - h0.x, pv[1] - h0.y);
    pl1 = pack2<false>(pv[2] - h1.x, pv[3] - h1.y);
  }
  if constexpr (LATE_V) load_v();
  uint32_t v0[8], v1[8], v2[8], v3[8];
  L::v_frags(vr[0], vr[1], v0, v1);
  L::v_frags(vr[2], vr[3], v2, v3);
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
    const uint32_t a[4] = {v0[mt], v1[mt], v2[mt], v3[mt]};
    mma_full<F16>(st.acc[mt], a, pb0, pb1);
    if constexpr (SPLIT && !F16) mma_full<F16>(st.acc[mt], a, pl0, pl1);
  }
}

// q's fragment: row gr is query head gr of the G that start at q (bf16, HD apart; rows >= G
// zero), the lane's pairs of dims (k_pair), as f16 pairs over fp8 caches.
template <typename KT, int G>
__device__ __forceinline__ void mma_q_frags(const __nv_bfloat16* q, int gr, int t,
                                            uint32_t (&qa)[16]) {
  using L = MmaKv<KT>;
  const __nv_bfloat16* row = q + (size_t)min(gr, G - 1) * HD;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    uint32_t w = gr < G ? *reinterpret_cast<const uint32_t*>(row + L::k_pair(t, j)) : 0u;
    if constexpr (L::F16) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
      w = pack2<true>(f.x, f.y);
    }
    qa[j] = w;
  }
}

__device__ __forceinline__ void mma_state_empty(MmaState& st) {
  st.m = -INFINITY;
  st.l = 0.f;
#pragma unroll
  for (int mt = 0; mt < 8; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) st.acc[mt][i] = 0.f;
}

// The block's warps' states in shared memory (over the stages, once every warp is done with
// them): per warp and head the max (log2 units) and sum, and the accumulators times V's scale.
template <int G>
struct MmaWarps {
  float m[MMA_WARPS][G], l[MMA_WARPS][G];
  float acc[MMA_WARPS][G][HD];
};
constexpr int MMA_WARPS_BYTES = (int)sizeof(MmaWarps<8>);

// The CUDA-core loop's half-warp states (attention.cuh's store_groups / merge_groups), where
// fused_decode.cu's tensor-core kernels keep them: over the stages, as MmaWarps.
template <int G>
struct GroupStates {
  float m[GROUPS][G], l[GROUPS][G];
  float acc[GROUPS][G][HD];
};
// Dynamic shared memory that holds any group's MmaWarps and GroupStates, at least (the host
// sizes launches by it too).
constexpr int MMA_STATES_BYTES = (int)sizeof(GroupStates<8>);
static_assert(MMA_STATES_BYTES >= MMA_WARPS_BYTES && MMA_STATES_BYTES == 33280,
              "src/engine/cuda/attention_handles.rs sizes launches by it");

// This warp's state into w (the caller synchronizes the block before and after): its row sums
// over the quad first.
template <typename KT, int G>
__device__ __forceinline__ void mma_store_warp(MmaState& st, float vs, int warp, int gr, int t,
                                               MmaWarps<G>& w) {
  using L = MmaKv<KT>;
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);
  if (gr < G && t == 0) {
    w.m[warp][gr] = st.m;
    w.l[warp][gr] = st.l;
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int h = 2 * t + j;
    if (h < G) {
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        w.acc[warp][h][L::v_dim(gr, mt, 0)] = st.acc[mt][j] * vs;
        w.acc[warp][h][L::v_dim(gr, mt, 1)] = st.acc[mt][2 + j] * vs;
      }
    }
  }
}

// The block's max M (log2 units), sum L and accumulator A for head g, dim d, from its warps'.
template <int G>
__device__ __forceinline__ void mma_merge_warps(const MmaWarps<G>& w, int g, int d, float& M,
                                                float& L, float& A) {
  M = -INFINITY;
#pragma unroll
  for (int k = 0; k < MMA_WARPS; ++k) M = fmaxf(M, w.m[k][g]);
  L = 0.f;
  A = 0.f;
  if (M != -INFINITY) {
#pragma unroll
    for (int k = 0; k < MMA_WARPS; ++k) {
      const float wt = fast_exp2(w.m[k][g] - M);
      L += w.l[k][g] * wt;
      A += w.acc[k][g][d] * wt;
    }
  }
}

}  // namespace
