// Shared by the flash prefill kernels (flash_prefill.cu: mma.sync, sm_80+; flash_prefill_sm90.cu:
// wgmma, sm_90a): the block's tile of the prefill, the shared-memory layout of Q/K/V tiles,
// the cp.async loads through the block table, the online softmax of one 64-key tile and the
// output. A block of ROWS / 16 warps takes ROWS query rows (64: one warpgroup; 128: two):
// ROWS / G tokens of one sequence times the G query heads of one KV head (the GQA heads and
// all the block's tokens share every K/V tile); warp w owns rows 16w .. 16w + 15, and each lane
// holds rows gr and gr + 8 of them (gr = lane / 4) in the accumulator layout of mma.sync m16n8
// (which is wgmma's, per warp).
#pragma once

#include "attention.cuh"

namespace {

constexpr int FA_BK = 64;
constexpr int FA_TILE = FA_BK * HD;  // elements of one K or V tile
constexpr float LOG2E = 1.4426950408889634f;

// Bytes of shared memory of a block of ROWS query rows: the Q tile, two K tiles and two V
// tiles, plus 1 KB to align them to 1024 bytes (FLASH_PREFILL_SMEM_* in
// src/engine/cuda/kernels.rs).
template <int ROWS>
constexpr int flash_smem_bytes() {
  return (ROWS * HD + 4 * FA_TILE) * 2 + 1024;
}
static_assert(flash_smem_bytes<64>() == 82944, "the host launches 64-row blocks with 81 KB");
static_assert(flash_smem_bytes<128>() == 99328, "the host launches 128-row blocks with 97 KB");

// Element offset of (row, col) in a ROWS x 128 bf16 tile in the canonical 128-byte-swizzled
// K-major layout of wgmma: two halves of 64 columns (ROWS * 128 bytes each); in a half, row r
// is 128 bytes at r * 128 and its 16-byte chunk c sits at chunk c ^ (r % 8). ldmatrix reads
// of 8 rows at one chunk hit 8 different bank groups, and a 1024-byte aligned tile is a valid
// wgmma operand (K-major for Q and K, MN-major for V).
template <int ROWS = FA_BK>
__device__ __forceinline__ int sw128(int r, int c) {
  return (c >> 6) * (ROWS * 64) + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (no bytes are read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// 2^x in one MUFU instruction (exp2f adds range fix-ups for denormal results, which round to
// 0 here anyway: probabilities below 2^-126 of the row maximum); 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The block's share of the prefill: grid = tiles x KV heads x splits, split fastest, then KV
// head, tiles longest-first (the last tile of the tiles list, the end of a prompt, launches
// first, so the causal triangle leaves no tail of long blocks at the end of the grid).
struct FlashTile {
  int kh, split;
  uint32_t row0, q_off;
  int tok;      // query tokens of this block
  int q_first;  // position of its first query token
  int kend;     // keys it attends to: [0, kend)
  int n_tiles;  // K/V tiles of FA_BK keys
  const uint32_t* table;
  size_t head_base;
  int prefix;   // keys before the chunk (cached); the chunk's own are rows row0 + (pos - prefix)
  int nkv;
  bool fresh;   // the chunk's keys and values come unrounded from p.k_new / p.v_new
};

template <int G, int ROWS>
__device__ __forceinline__ FlashTile flash_tile(const PrefillParams& p, int splits) {
  FlashTile t;
  const int nkv = p.nkv, num_tiles = gridDim.x / (nkv * splits);
  const int rest = blockIdx.x / splits;
  t.split = blockIdx.x % splits;
  t.kh = rest % nkv;
  const int tile = num_tiles - 1 - rest / nkv;
  const uint32_t seq = p.tiles[2 * tile];
  t.q_off = p.tiles[2 * tile + 1];
  t.row0 = p.seq_meta[4 * seq];
  const uint32_t q_len = p.seq_meta[4 * seq + 1];
  const int ctx = (int)p.seq_meta[4 * seq + 2];
  t.table = p.tables + p.seq_meta[4 * seq + 3];
  t.tok = min(ROWS / G, (int)(q_len - t.q_off));
  t.q_first = ctx - (int)q_len + (int)t.q_off;
  t.kend = t.q_first + t.tok;
  t.n_tiles = (t.kend + FA_BK - 1) / FA_BK;
  t.head_base = (size_t)t.kh * (size_t)p.num_slots;
  t.prefix = ctx - (int)q_len;
  t.nkv = nkv;
  t.fresh = p.k_new != nullptr && p.v_new != nullptr;
  return t;
}

// Thread tid's share of a tile load by NT threads: 16-byte chunk lc of rows lr, lr + STEP, ...
template <int NT>
struct FlashLoader {
  static constexpr int STEP = NT / 16;
  static constexpr int N = FA_BK / STEP;  // rows of a K/V tile per thread
  int lc, lr;
  size_t off[N];  // element offsets in the caches of this thread's rows
  bool ok[N];
  bool fresh[N];   // a key of the chunk itself, read from the unrounded rows (fp8 caches)
  size_t foff[N];  // its element offset there ([rows, nkv, 128])

  __device__ __forceinline__ explicit FlashLoader(int tid) : lc(tid % 16), lr(tid / 16) {}

  // Q rows r = token * G + head of the block (zero rows past the chunk).
  template <int G, int ROWS>
  __device__ __forceinline__ void q(const __nv_bfloat16* q, const FlashTile& t, int nh,
                                    __nv_bfloat16* dst) const {
#pragma unroll
    for (int x = 0; x < ROWS / STEP; ++x) {
      int r = lr + STEP * x, i = r / G, g = r % G;
      bool valid = i < t.tok;
      const __nv_bfloat16* src =
          valid ? q + ((size_t)(t.row0 + t.q_off + i) * nh + t.kh * G + g) * HD + lc * 8 : q;
      cp_async16(smem_addr(dst + sw128<ROWS>(r, lc * 8)), src, valid);
    }
  }

  // The cache slots of K/V tile j's rows (K and V share them); keys past kend read nothing.
  // A power-of-two block size (the engine's) divides by shifting.
  __device__ __forceinline__ void slots(const FlashTile& t, int j, int bs) {
    const bool pow2 = (bs & (bs - 1)) == 0;
    const int shift = __ffs(bs) - 1;
#pragma unroll
    for (int x = 0; x < N; ++x) {
      int pos = j * FA_BK + lr + STEP * x;
      ok[x] = pos < t.kend;
      int blk = pow2 ? pos >> shift : pos / bs, in = pow2 ? pos & (bs - 1) : pos % bs;
      size_t slot = ok[x] ? (size_t)t.table[blk] * bs + in : 0;
      off[x] = (t.head_base + slot) * HD + lc * 8;
      fresh[x] = ok[x] && t.fresh && pos >= t.prefix;
      foff[x] = fresh[x] ? ((size_t)(t.row0 + (pos - t.prefix)) * t.nkv + t.kh) * HD + lc * 8 : 0;
    }
  }

  __device__ __forceinline__ void tile(const __nv_bfloat16* cache, float, const void*,
                                      __nv_bfloat16* dst) const {
#pragma unroll
    for (int x = 0; x < N; ++x) {
      int r = lr + STEP * x;
      cp_async16(smem_addr(dst + sw128(r, lc * 8)), cache + off[x], ok[x]);
    }
  }

  // An fp8 cache's tile: every row's 8 bytes loaded at once, then dequantized (times `scale`)
  // into the same bf16 tile in registers and stored (synchronously: the tile is in shared
  // memory when the caller's next barrier passes; keys past kend are zeros). Keys of the
  // chunk itself come unrounded from `fresh_rows` (bf16 [rows, nkv, 128]) when given.
  __device__ __forceinline__ void tile(const fp8* cache, float scale, const void* fresh_rows,
                                      __nv_bfloat16* dst) const {
    const __nv_bfloat16* fr = (const __nv_bfloat16*)fresh_rows;
    uint2 raw[N];
#pragma unroll
    for (int x = 0; x < N; ++x)
      raw[x] = ok[x] && !fresh[x] ? *reinterpret_cast<const uint2*>(cache + off[x])
                                  : make_uint2(0u, 0u);
#pragma unroll
    for (int x = 0; x < N; ++x) {
      if (fresh[x]) {
        cp_async16(smem_addr(dst + sw128(lr + STEP * x, lc * 8)), fr + foff[x], true);
        continue;
      }
      float f[8];
      fp8x8_to_f32(raw[x], scale, f);
      const uint4 v = make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]),
                                 pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7]));
      *reinterpret_cast<uint4*>(dst + sw128(lr + STEP * x, lc * 8)) = v;
    }
  }
};

// The lane's running softmax state: maxima m and (lane-partial) sums l of its two rows.
struct FlashRows {
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
};

// One tile of scores s (16 rows x 64 keys per warp, accumulator layout) into the online
// softmax: the causal mask on tiles that reach past the block's first query position, the
// rescale of the output o, and P as bf16 A fragments of P V (the accumulator layout of two
// 8-key blocks is the A layout of one 16-key step). Maxima stay in the scores' units; each
// exponential is one FFMA into exp2. pos0 / pos1 are the positions of the lane's rows (rows
// past the chunk never mask: their scores stay finite and their output is not written).
__device__ __forceinline__ void flash_softmax(float (&s)[FA_BK / 8][4], float (&o)[HD / 8][4],
                                              FlashRows& st, uint32_t (&pf)[FA_BK / 16][4],
                                              int k0, bool masked, int pos0, int pos1, int tq) {
  if (masked) {
#pragma unroll
    for (int n = 0; n < FA_BK / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int key = k0 + n * 8 + 2 * tq + (e & 1);
        if (key > (e < 2 ? pos0 : pos1)) s[n][e] = -INFINITY;
      }
    }
  }
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int n = 0; n < FA_BK / 8; ++n) {
    mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
    mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
  }
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
  }
  const float mn0 = fmaxf(st.m0, mx0), mn1 = fmaxf(st.m1, mx1);
  // A row with no key yet keeps base 0 (its exponentials are all 0 and stay finite).
  const float b0 = mn0 == -INFINITY ? 0.f : mn0 * LOG2E, b1 = mn1 == -INFINITY ? 0.f : mn1 * LOG2E;
  // The output is rescaled only when a row maximum of the warp grew (past the first tiles of
  // a long prompt it rarely does).
  if (__any_sync(0xffffffffu, mn0 != st.m0 || mn1 != st.m1)) {
    const float c0 = fast_exp2(fmaf(st.m0, LOG2E, -b0)), c1 = fast_exp2(fmaf(st.m1, LOG2E, -b1));
    st.l0 *= c0;
    st.l1 *= c1;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[n][0] *= c0;
      o[n][1] *= c0;
      o[n][2] *= c1;
      o[n][3] *= c1;
    }
  }
  st.m0 = mn0;
  st.m1 = mn1;
#pragma unroll
  for (int n = 0; n < FA_BK / 8; ++n) {
    float p0 = fast_exp2(fmaf(s[n][0], LOG2E, -b0)), p1 = fast_exp2(fmaf(s[n][1], LOG2E, -b0));
    float p2 = fast_exp2(fmaf(s[n][2], LOG2E, -b1)), p3 = fast_exp2(fmaf(s[n][3], LOG2E, -b1));
    st.l0 += p0 + p1;
    st.l1 += p2 + p3;
    pf[n / 2][(n & 1) * 2] = pack_bf16(p0, p1);
    pf[n / 2][(n & 1) * 2 + 1] = pack_bf16(p2, p3);
  }
}

// The output o / l of the warp's 16 rows, staged through its own rows of the Q tile (each
// warp only ever read its own rows there) for 16-byte stores.
template <int G, int ROWS>
__device__ __forceinline__ void flash_store(const float (&o)[HD / 8][4], FlashRows st,
                                            const FlashTile& t, int nh, __nv_bfloat16* sq,
                                            __nv_bfloat16* out) {
  const int lane = threadIdx.x % 32, wrow = (threadIdx.x / 32) * 16;
  const int gr = lane / 4, tq = lane % 4;
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, x);
    st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, x);
  }
  const float i0 = st.l0 > 0.f ? 1.f / st.l0 : 0.f, i1 = st.l1 > 0.f ? 1.f / st.l1 : 0.f;
  __syncwarp();
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    int c = n * 8 + 2 * tq;
    *reinterpret_cast<uint32_t*>(sq + sw128<ROWS>(wrow + gr, c)) = pack_bf16(o[n][0] * i0, o[n][1] * i0);
    *reinterpret_cast<uint32_t*>(sq + sw128<ROWS>(wrow + gr + 8, c)) =
        pack_bf16(o[n][2] * i1, o[n][3] * i1);
  }
  __syncwarp();
#pragma unroll
  for (int x = 0; x < 16 * (HD / 8) / 32; ++x) {
    int e = lane + 32 * x, r = wrow + e / (HD / 8), c = (e % (HD / 8)) * 8;
    int i = r / G, g = r % G;
    if (i < t.tok) {
      __nv_bfloat16* dst = out + ((size_t)(t.row0 + t.q_off + i) * nh + t.kh * G + g) * HD + c;
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(sq + sw128<ROWS>(r, c));
    }
  }
}

// The K/V tiles [j0, j1) of split `t.split` of `splits` (all of them for one split).
__device__ __forceinline__ void flash_split_range(const FlashTile& t, int splits, int& j0,
                                                  int& j1) {
  const int per = (t.n_tiles + splits - 1) / splits;
  j0 = min(t.n_tiles, t.split * per);
  j1 = min(t.n_tiles, j0 + per);
}

// A split's unnormalized output and its rows' (max, sum) into the f32 partials of `p` (rows
// past the chunk are skipped); flash_merge combines them.
template <int G>
__device__ __forceinline__ void flash_store_partial(const float (&o)[HD / 8][4], FlashRows st,
                                                    const FlashTile& t, const PrefillParams& p) {
  const int lane = threadIdx.x % 32, wrow = (threadIdx.x / 32) * 16;
  const int gr = lane / 4, tq = lane % 4, nh = p.nkv * G;
  const int T = p.rows;
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, x);
    st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, x);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = wrow + gr + 8 * half, i = r / G, g = r % G;
    if (i >= t.tok) continue;
    const size_t row = ((size_t)t.split * T + t.row0 + t.q_off + i) * nh + t.kh * G + g;
    float* po = p.part_o + row * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
      *reinterpret_cast<float2*>(po + n * 8 + 2 * tq) =
          make_float2(o[n][2 * half], o[n][2 * half + 1]);
    if (tq == 0)
      *reinterpret_cast<float2*>(p.part_ml + row * 2) =
          half ? make_float2(st.m1, st.l1) : make_float2(st.m0, st.l0);
  }
}

// out = the splits' outputs combined: each weighted by 2^((m_s - M) log2 e), divided by the
// weighted sum. One block per (tile, KV head) of the prefill launch (so only prefill rows are
// touched, never the decode rows of a mixed step), a warp per row, 4 dims a lane.
template <int G, int ROWS>
__device__ __forceinline__ void flash_merge(const PrefillParams& p) {
  const int nkv = p.nkv, nh = nkv * G, T = p.rows;
  const int kh = blockIdx.x % nkv, tile = blockIdx.x / nkv;
  const uint32_t seq = p.tiles[2 * tile], q_off = p.tiles[2 * tile + 1];
  const uint32_t row0 = p.seq_meta[4 * seq], q_len = p.seq_meta[4 * seq + 1];
  const int tok = min(ROWS / G, (int)(q_len - q_off));
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int r = threadIdx.x / 32; r < ROWS; r += warps) {
    const int i = r / G, g = r % G;
    if (i >= tok) break;
    const size_t base = ((size_t)(row0 + q_off + i)) * nh + kh * G + g;
    float M = -INFINITY;
    for (int s = 0; s < p.splits; ++s) M = fmaxf(M, p.part_ml[((size_t)s * T * nh + base) * 2]);
    float L = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < p.splits; ++s) {
      const size_t row = (size_t)s * T * nh + base;
      const float2 ml = *reinterpret_cast<const float2*>(p.part_ml + row * 2);
      const float w = ml.x == -INFINITY ? 0.f : fast_exp2((ml.x - M) * LOG2E);
      L += ml.y * w;
      const float4 v = *reinterpret_cast<const float4*>(p.part_o + row * HD + lane * 4);
      acc[0] += v.x * w;
      acc[1] += v.y * w;
      acc[2] += v.z * w;
      acc[3] += v.w * w;
    }
    const float inv = L > 0.f ? 1.f / L : 0.f;
    __nv_bfloat16* dst = (__nv_bfloat16*)p.out + base * HD + lane * 4;
    *reinterpret_cast<uint32_t*>(dst) = pack_bf16(acc[0] * inv, acc[1] * inv);
    *reinterpret_cast<uint32_t*>(dst + 2) = pack_bf16(acc[2] * inv, acc[3] * inv);
  }
}

// The shared memory of a block, its tiles aligned to 1024 bytes: Q, K[2], V[2].
__device__ __forceinline__ __nv_bfloat16* flash_smem(unsigned char* raw) {
  uintptr_t a = reinterpret_cast<uintptr_t>(raw);
  return reinterpret_cast<__nv_bfloat16*>((a + 1023) & ~(uintptr_t)1023);
}

}  // namespace
