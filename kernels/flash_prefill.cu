// Flash prefill attention over the paged caches (bf16, sm_80+): causal varlen attention of
// prefill chunks (each chunk against its sequence's cached prefix and itself), in the design of
// FlashAttention-2:
//  * a block of 4 warps takes FA_ROWS = 64 query rows (FA_ROWS / G tokens of one sequence times
//    the G query heads of one KV head: the GQA heads share every K/V tile); each warp owns 16
//    rows and keeps its Q fragments, scores, probabilities and output accumulators in
//    registers (mma.sync m16n8k16, bf16 in, f32 accumulation);
//  * K and V tiles of FA_BK = 64 keys are read through the block table by cp.async into
//    double-buffered, XOR-swizzled shared memory (ldmatrix reads them without bank conflicts);
//    the next tile's K loads while this tile's scores are computed, its V while P V runs;
//  * online softmax in base 2, row sums kept per thread and reduced once at the end; P goes
//    from the score accumulators to the A operand of P V without leaving registers;
//  * only the last tiles of a block (keys past its first query position) are masked;
//  * blocks are launched longest-first (the tiles of the end of a prompt attend to the most
//    keys) so the causal triangle does not leave a tail of long blocks at the end of the grid.
// The prefix a block attends to is read once per K/V tile for all its 64 rows, so a long
// prompt costs O(P^2 / 64) tile reads, not one pass per query row.
//
// Parameters are `PrefillParams` (attention.cuh), with the same tiles / seq_meta / tables as the
// other prefill kernels (tiles step by FA_ROWS / G query tokens). Dynamic shared memory:
// FA_SMEM bytes (the launch sets the function's limit above 48 KB).

#include "attention.cuh"

namespace {

constexpr int FA_ROWS = 64;
constexpr int FA_BK = 64;
constexpr int FA_WARPS = 4;
constexpr int FA_THREADS = 32 * FA_WARPS;
constexpr int FA_TILE = FA_BK * HD;  // elements of one K or V tile
// Q tile + two K tiles + two V tiles.
constexpr int FA_SMEM = (FA_ROWS * HD + 4 * FA_TILE) * 2;
constexpr float LOG2E = 1.4426950408889634f;

static_assert(FA_THREADS == THREADS, "the launch uses the attention block size");
static_assert(FA_ROWS == 16 * FA_WARPS, "a warp owns 16 query rows");
// FLASH_PREFILL_SMEM in src/engine/cuda/attention.rs.
static_assert(FA_SMEM == 81920, "the host launches with 80 KB of dynamic shared memory");

// Offset (in elements) of (row, col) in a [rows][HD] bf16 tile whose 16-byte chunks are
// XOR-swizzled by the row's low 3 bits: the 8 rows an ldmatrix phase reads hit 8 different
// bank groups.
__device__ __forceinline__ int swz(int row, int col) {
  return row * HD + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
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

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a (16x16, row) * b (16x8, col): bf16 in, f32 accumulation.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <int G>
__device__ void flash_prefill(const PrefillParams& p) {
  extern __shared__ __align__(128) __nv_bfloat16 fa_smem[];
  __nv_bfloat16* sq = fa_smem;
  __nv_bfloat16* sk = sq + FA_ROWS * HD;  // [2][FA_BK][HD]
  __nv_bfloat16* sv = sk + 2 * FA_TILE;   // [2][FA_BK][HD]

  const __nv_bfloat16* q = (const __nv_bfloat16*)p.q;
  const __nv_bfloat16* k_cache = (const __nv_bfloat16*)p.k_cache;
  const __nv_bfloat16* v_cache = (const __nv_bfloat16*)p.v_cache;
  __nv_bfloat16* out = (__nv_bfloat16*)p.out;
  constexpr int TOK = FA_ROWS / G;
  const int nkv = p.nkv, nh = nkv * G;
  const int num_tiles = gridDim.x / nkv;
  // Longest-first: the last tile of the tiles list (the end of a prompt) launches first.
  const int kh = blockIdx.x % nkv;
  const int tile = num_tiles - 1 - (int)(blockIdx.x / nkv);
  const uint32_t seq = p.tiles[2 * tile], q_off = p.tiles[2 * tile + 1];
  const uint32_t row0 = p.seq_meta[4 * seq], q_len = p.seq_meta[4 * seq + 1];
  const int ctx = (int)p.seq_meta[4 * seq + 2];
  const uint32_t* table = p.tables + p.seq_meta[4 * seq + 3];
  const int tok = min(TOK, (int)(q_len - q_off));   // query tokens of this block
  const int q_first = ctx - (int)q_len + (int)q_off;  // position of its first query token
  const int kend = q_first + tok;                      // keys it attends to: [0, kend)
  const int n_tiles = (kend + FA_BK - 1) / FA_BK;
  const int bs = p.block_size;
  const size_t head_base = (size_t)kh * (size_t)p.num_slots;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Loader geometry: thread tid copies 16-byte chunk `lc` of rows lr, lr + 8, ... (8 rows of
  // 64 in a K or V tile, 8 of 64 in the Q tile).
  const int lc = tid % 16, lr = tid / 16;

  // Q rows r = token * G + head (zero rows past the chunk), with K tile 0: group 0.
  for (int x = 0; x < FA_ROWS / 8; ++x) {
    int r = lr + 8 * x, i = r / G, g = r % G;
    bool ok = i < tok;
    const __nv_bfloat16* src =
        ok ? q + ((size_t)(row0 + q_off + i) * nh + kh * G + g) * HD + lc * 8 : q;
    cp_async16(smem_addr(sq + swz(r, lc * 8)), src, ok);
  }
  // Slots of this thread's 8 rows of the tile being loaded (K and V share them).
  size_t slot_off[FA_BK / 8];
  bool slot_ok[FA_BK / 8];
  auto slots_of = [&](int j) {
#pragma unroll
    for (int x = 0; x < FA_BK / 8; ++x) {
      int pos = j * FA_BK + lr + 8 * x;
      slot_ok[x] = pos < kend;
      size_t slot = slot_ok[x] ? (size_t)table[pos / bs] * bs + pos % bs : 0;
      slot_off[x] = (head_base + slot) * HD + lc * 8;
    }
  };
  auto load_tile = [&](const __nv_bfloat16* cache, __nv_bfloat16* dst) {
#pragma unroll
    for (int x = 0; x < FA_BK / 8; ++x) {
      int r = lr + 8 * x;
      cp_async16(smem_addr(dst + swz(r, lc * 8)), cache + slot_off[x], slot_ok[x]);
    }
  };
  slots_of(0);
  load_tile(k_cache, sk);
  cp_async_commit();
  load_tile(v_cache, sv);
  cp_async_commit();

  // This lane's rows in the warp's 16: gr and gr + 8; its column pair within an 8-block: 2 * tq.
  const int gr = lane / 4, tq = lane % 4;
  const int wrow = warp * 16;
  // Absolute positions of the lane's two query rows (rows past the chunk never mask: their
  // scores are finite and their output is not written).
  const int pos0 = q_first + (wrow + gr) / G;
  const int pos1 = q_first + (wrow + gr + 8) / G;

  cp_async_wait<1>();
  __syncthreads();
  // Q fragments (A operand), 8 k-steps of 16 dims.
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    int r = wrow + (lane & 7) + ((lane >> 3) & 1) * 8, c = kk * 16 + (lane >> 4) * 8;
    ldsm_x4(smem_addr(sq + swz(r, c)), qf[kk]);
  }

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  for (int j = 0; j < n_tiles; ++j) {
    const int buf = j & 1;
    const __nv_bfloat16* kt = sk + buf * FA_TILE;
    const __nv_bfloat16* vt = sv + buf * FA_TILE;
    // Next K tile into the other buffer (its last readers passed the barrier that ended the
    // previous iteration).
    if (j + 1 < n_tiles) {
      slots_of(j + 1);
      load_tile(k_cache, sk + (buf ^ 1) * FA_TILE);
    }
    cp_async_commit();

    // S = Q K^T: 16 rows x 64 keys per warp, 8 blocks of 8 keys.
    float s[FA_BK / 8][4];
#pragma unroll
    for (int n = 0; n < FA_BK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < FA_BK / 16; ++np) {
        uint32_t b[4];
        int r = np * 16 + (lane & 7) + (lane >> 4) * 8, c = kk * 16 + ((lane >> 3) & 1) * 8;
        ldsm_x4(smem_addr(kt + swz(r, c)), b);
        mma_bf16(s[2 * np], qf[kk], b[0], b[1]);
        mma_bf16(s[2 * np + 1], qf[kk], b[2], b[3]);
      }
    }
    // Scores in base 2; causal mask on the tiles that reach past the first query position.
    const int k0 = j * FA_BK;
    const bool masked = k0 + FA_BK - 1 > q_first;
#pragma unroll
    for (int n = 0; n < FA_BK / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int key = k0 + n * 8 + 2 * tq + (e & 1);
        int pos = e < 2 ? pos0 : pos1;
        float v = s[n][e] * LOG2E;
        s[n][e] = masked && key > pos ? -INFINITY : v;
      }
    }
    // Online softmax: row maxima over the quad, rescale of the running state.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < FA_BK / 8; ++n) {
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // A row with no key yet keeps base 0 (its exponentials are all 0 and stay finite).
    const float b0 = mn0 == -INFINITY ? 0.f : mn0, b1 = mn1 == -INFINITY ? 0.f : mn1;
    const float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);
    m0 = mn0;
    m1 = mn1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[n][0] *= c0;
      o[n][1] *= c0;
      o[n][2] *= c1;
      o[n][3] *= c1;
    }
    // P (bf16, A operand of P V: the accumulator layout of two 8-key blocks is the A layout
    // of one 16-key step).
    uint32_t pf[FA_BK / 16][4];
#pragma unroll
    for (int n = 0; n < FA_BK / 8; ++n) {
      float p0 = exp2f(s[n][0] - b0), p1 = exp2f(s[n][1] - b0);
      float p2 = exp2f(s[n][2] - b1), p3 = exp2f(s[n][3] - b1);
      l0 += p0 + p1;
      l1 += p2 + p3;
      pf[n / 2][(n & 1) * 2] = pack_bf16(p0, p1);
      pf[n / 2][(n & 1) * 2 + 1] = pack_bf16(p2, p3);
    }

    // V tile j is the older of the two groups in flight (K j+1 is the newer).
    cp_async_wait<1>();
    __syncthreads();
    if (j + 1 < n_tiles) load_tile(v_cache, sv + (buf ^ 1) * FA_TILE);
    cp_async_commit();

    // O += P V: 4 steps of 16 keys, 8 pairs of 8-dim blocks.
#pragma unroll
    for (int kk = 0; kk < FA_BK / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t b[4];
        int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = dp * 16 + (lane >> 4) * 8;
        ldsm_x4_t(smem_addr(vt + swz(r, c)), b);
        mma_bf16(o[2 * dp], pf[kk], b[0], b[1]);
        mma_bf16(o[2 * dp + 1], pf[kk], b[2], b[3]);
      }
    }
    // K tile j + 1 is now the older group in flight.
    cp_async_wait<1>();
    __syncthreads();
  }
  cp_async_wait<0>();

  // Row sums over the quad, then the output through this warp's rows of the Q tile (each
  // warp only ever read its own 16 rows there) for 16-byte stores.
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
  }
  const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
  __syncwarp();
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    int c = n * 8 + 2 * tq;
    *reinterpret_cast<uint32_t*>(sq + swz(wrow + gr, c)) = pack_bf16(o[n][0] * i0, o[n][1] * i0);
    *reinterpret_cast<uint32_t*>(sq + swz(wrow + gr + 8, c)) =
        pack_bf16(o[n][2] * i1, o[n][3] * i1);
  }
  __syncwarp();
#pragma unroll
  for (int x = 0; x < 16 * (HD / 8) / 32; ++x) {
    int e = lane + 32 * x, r = wrow + e / (HD / 8), c = (e % (HD / 8)) * 8;
    int i = r / G, g = r % G;
    if (i < tok) {
      __nv_bfloat16* dst = out + ((size_t)(row0 + q_off + i) * nh + kh * G + g) * HD + c;
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(sq + swz(r, c));
    }
  }
}

}  // namespace

// Two blocks per SM (80 KB of shared memory and at most 255 registers a thread each).
#define PS_FLASH_PREFILL(G)                                                                      \
  extern "C" __global__ void __launch_bounds__(FA_THREADS, 2)                                   \
      flash_prefill_g##G##_bf16(const PrefillParams p) {                                        \
    pdl_entry();                                                                                \
    flash_prefill<G>(p);                                                                        \
  }
PS_FLASH_PREFILL(1)
PS_FLASH_PREFILL(2)
PS_FLASH_PREFILL(4)
PS_FLASH_PREFILL(8)
