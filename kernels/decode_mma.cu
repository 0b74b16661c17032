// Paged decode attention on tensor cores (mma.sync m16n8k16, f32 accumulation): the grid,
// partitions, outputs and partials of paged_decode (decode.cu), whose reduce merges them, so
// a launch may take either kernel (`LaunchOptions::mma_decode`). What differs is how the
// caches are read: paged_decode spends ~50 warp instructions on each token of each KV head
// (convert, 8 FMAs and 4 shuffle rounds per query head, the online softmax per token) and
// keeps a lane's next few K/V rows in registers, 8 bytes a row over fp8 caches, too few bytes
// in flight to read them at the memory's rate (1.6-2.1 TB/s on the H200, bf16 2.7-3.5). Here a
// warp takes 16 tokens at a time:
//   S = Q Kᵀ      A = the G query heads (rows 0..G-1 of 16; the rest zero), B = 8 tokens' keys;
//   Oᵀ += Vᵀ Pᵀ   A = 16 dims of the 16 tokens' values, B = their probabilities (the lane holds
//                 them as S's accumulator left them), 8 tiles of 16 dims x 8 heads;
// 24 MMAs and ~150 other instructions per 16 tokens, the online softmax once per 16 tokens.
// bf16 caches use bf16 MMAs (P rounded to bf16, as flash attention does; or, with
// `mma_decode_split_p`, as a bf16 pair, high part and remainder: 8 MMAs more); fp8 caches f16
// MMAs (e4m3 converts to f16 exactly in one instruction a pair; q and P are rounded to f16).
//
// A dot product does not care in which order the head's dims are paired, so each lane loads
// whole 16-byte pieces of a row and the MMA fragments are taken from them as they lie: lane
// (gr = lane / 4, t = lane % 4) holds keys of tokens gr and 8 + gr at the dims `k_pair(t, j)`
// (q's fragment pairs the same dims), and values of tokens 2t, 2t+1, 8+2t, 9+2t at the dims
// `v_dim(gr, mt, hi)` (rows gr and gr + 8 of Vᵀ's tile mt), where Oᵀ's rows land too.
// Each warp of the block takes every fourth chunk of 16 tokens of the partition and streams
// them through DEPTH stages of shared memory of its own with cp.async (16-byte copies that hold
// no registers while in flight: a warp keeps DEPTH - 1 chunks loading while it computes one;
// the first version, which loaded into registers, held too few bytes in flight to read fp8
// caches faster than the CUDA-core kernel). Rows are stored with their 16-byte pieces XOR-
// swizzled so that the fragment reads hit 32 different banks. The warps' states merge through
// the same shared memory.

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

// A warp's online-softmax state: head gr's running max (log2 units) and this lane's share of
// its sum, and Oᵀ's tiles: acc[mt] holds heads 2t, 2t + 1 at v_dim(gr, mt, 0) (0, 1) and at
// v_dim(gr, mt, 1) (2, 3).
struct MmaState {
  float m, l;
  float acc[8][4];
};

// One chunk into the state: scores (times sc: K's scale and log2 e), the chunk's max over the
// quad, rescaling only when some row's max moved, then P V. SPLIT (bf16 only): P goes through
// the MMA as a bf16 pair, its high part and the remainder.
template <typename KT, bool SPLIT>
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
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int i = 0; i < L::VU; ++i) {
      const int r = 2 * t + (u & 1) + 8 * (u >> 1);
      vr[u][i] =
          *reinterpret_cast<const uint4*>(stg + (CHUNK + r) * ROWB + v_phys(r, 8 * i + gr) * 16);
    }
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

template <typename KT, int G, int DEPTH, bool SPLIT>
__device__ void paged_decode_mma(const DecodeParams& p) {
  using L = MmaKv<KT>;
  static_assert(G <= 8, "the query heads of a KV head are rows 0..7 of the MMA");
  const int b = blockIdx.x, kh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int nh = p.nkv * G;
  const int ctx = (int)p.ctx_lens[b];
  const int W = p.width != nullptr ? (int)*p.width : p.W;
  const int part = decode_part(ctx, splits, p.part);
  const int start = split * part;
  if (splits > 1 && start >= ctx) return;
  const int end = min(ctx, start + part);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t = lane % 4;
  const int bs = p.block_size;
  MmaTable tb;
  tb.table = p.block_tables + (size_t)b * W;
  tb.bs = bs;
  tb.shift = __ffs(bs) - 1;
  tb.fast = bs >= CHUNK && (bs & (bs - 1)) == 0 && start % CHUNK == 0;
  const size_t head_base = (size_t)kh * (size_t)p.num_slots;
  const KT* kc = (const KT*)p.k_cache;
  const KT* vc = (const KT*)p.v_cache;

  // q's fragment: row gr (query head kh * G + gr), the lane's pairs of dims; rows >= G zero.
  uint32_t qa[16];
  {
    const __nv_bfloat16* q =
        (const __nv_bfloat16*)p.q + ((size_t)b * nh + kh * G + min(gr, G - 1)) * HD;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      uint32_t w = gr < G ? *reinterpret_cast<const uint32_t*>(q + L::k_pair(t, j)) : 0u;
      if constexpr (L::F16) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
        w = pack2<true>(f.x, f.y);
      }
      qa[j] = w;
    }
  }
  const float sc = p.k_scale * LOG2E;
  MmaState st;
  st.m = -INFINITY;
  st.l = 0.f;
#pragma unroll
  for (int mt = 0; mt < 8; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) st.acc[mt][i] = 0.f;

  // Chunks warp, warp + 4, ... through the warp's DEPTH stages: DEPTH - 1 loading while one
  // computes. Every iteration commits one group (empty past the last chunk), so waiting for
  // all but the newest DEPTH - 1 groups waits for this chunk's.
  extern __shared__ __align__(16) unsigned char dsm[];
  constexpr int SB = stage_bytes<KT>();
  unsigned char* wsm = dsm + warp * DEPTH * SB;
  const int chunks = (end - start + CHUNK - 1) / CHUNK;
#pragma unroll
  for (int i = 0; i + 1 < DEPTH; ++i) {
    const int ci = warp + i * MMA_WARPS;
    if (ci < chunks) stage_load<KT>(wsm + i * SB, kc, vc, tb, head_base, start + ci * CHUNK, end, lane);
    cp_async_commit();
  }
  for (int k = 0, c = warp; c < chunks; ++k, c += MMA_WARPS) {
    const int cl = c + (DEPTH - 1) * MMA_WARPS;
    if (cl < chunks)
      stage_load<KT>(wsm + ((k + DEPTH - 1) % DEPTH) * SB, kc, vc, tb, head_base,
                     start + cl * CHUNK, end, lane);
    cp_async_commit();
    cp_async_wait<DEPTH - 1>();
    __syncwarp();
    mma_chunk<KT, SPLIT>(wsm + (k % DEPTH) * SB, qa, sc, start + c * CHUNK, end, gr, t, st);
    // Every lane has read the stage before the next iteration refills it.
    __syncwarp();
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the warps: row sums over the quad, then [warp][head] max/sum and accumulators
  // (times V's scale) through shared memory.
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);
  float(&sm)[MMA_WARPS][G] = *reinterpret_cast<float(*)[MMA_WARPS][G]>(dsm);
  float(&sl)[MMA_WARPS][G] = *reinterpret_cast<float(*)[MMA_WARPS][G]>(dsm + sizeof(sm));
  float(&sacc)[MMA_WARPS][G][HD] =
      *reinterpret_cast<float(*)[MMA_WARPS][G][HD]>(dsm + 2 * sizeof(sm));
  static_assert(MMA_WARPS * G * (HD + 2) * 4 <= MMA_WARPS * 2 * stage_bytes<fp8>(),
                "the merge fits in the stages' shared memory");
  if (gr < G && t == 0) {
    sm[warp][gr] = st.m;
    sl[warp][gr] = st.l;
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int h = 2 * t + j;
    if (h < G) {
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        sacc[warp][h][L::v_dim(gr, mt, 0)] = st.acc[mt][j] * p.v_scale;
        sacc[warp][h][L::v_dim(gr, mt, 1)] = st.acc[mt][2 + j] * p.v_scale;
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * HD; idx += MMA_WARPS * 32) {
    const int g = idx / HD, d = idx % HD, h = kh * G + g;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < MMA_WARPS; ++w) M = fmaxf(M, sm[w][g]);
    float Lsum = 0.f, A = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < MMA_WARPS; ++w) {
        const float wt = fast_exp2(sm[w][g] - M);
        Lsum += sl[w][g] * wt;
        A += sacc[w][g][d] * wt;
      }
    }
    if (splits == 1) {
      ((__nv_bfloat16*)p.out)[((size_t)b * nh + h) * HD + d] =
          __float2bfloat16(Lsum > 0.f ? A / Lsum : 0.f);
    } else {
      // paged_decode_reduce weighs partitions by e^(m - M): the max in natural units.
      const size_t pi = ((size_t)b * nh + h) * splits + split;
      p.part_acc[pi * HD + d] = A;
      if (d == 0) {
        p.part_ml[pi * 2] = M == -INFINITY ? M : M * LN2;
        p.part_ml[pi * 2 + 1] = Lsum;
      }
    }
  }
}

}  // namespace

// Depth D: shared-memory stages a warp streams its chunks through (dynamic shared memory of
// MMA_WARPS * D * stage_bytes: 16 KB a stage of fp8, 32 KB of bf16 per block). `bf16x2`: P as a
// bf16 pair (LaunchOptions::mma_decode_split_p).
#define PS_DECODE_MMA(KT, NAME, D, G, SPLIT)                                                   \
  extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32, 4)                              \
      paged_decode_mma_d##D##_g##G##_##NAME(const DecodeParams p) {                            \
    pdl_entry();                                                                               \
    paged_decode_mma<KT, G, D, SPLIT>(p);                                                      \
  }
#define PS_DECODE_MMA_ALL(KT, NAME, D, SPLIT) \
  PS_DECODE_MMA(KT, NAME, D, 1, SPLIT)        \
  PS_DECODE_MMA(KT, NAME, D, 2, SPLIT)        \
  PS_DECODE_MMA(KT, NAME, D, 4, SPLIT)        \
  PS_DECODE_MMA(KT, NAME, D, 8, SPLIT)

PS_DECODE_MMA_ALL(__nv_bfloat16, bf16, 2, false)
PS_DECODE_MMA_ALL(__nv_bfloat16, bf16, 3, false)
PS_DECODE_MMA_ALL(__nv_bfloat16, bf16x2, 2, true)
PS_DECODE_MMA_ALL(__nv_bfloat16, bf16x2, 3, true)
PS_DECODE_MMA_ALL(fp8, fp8, 2, false)
PS_DECODE_MMA_ALL(fp8, fp8, 3, false)
PS_DECODE_MMA_ALL(fp8, fp8, 4, false)
