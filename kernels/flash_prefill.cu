// Flash prefill attention over the paged caches on mma.sync (bf16, sm_80+; the sm_90 path is
// flash_prefill_sm90.cu): causal varlen attention of prefill chunks (each chunk against its
// sequence's cached prefix and itself), in the design of FlashAttention-2:
//  * a block of 4 warps takes 64 query rows (flash.cuh: the GQA heads of one KV head share
//    every K/V tile); each warp owns 16 rows and keeps its Q fragments, scores, probabilities
//    and output accumulators in registers (mma.sync m16n8k16, bf16 in, f32 accumulation);
//  * K and V tiles of 64 keys are read through the block table by cp.async into
//    double-buffered, swizzled shared memory (ldmatrix reads them without bank conflicts);
//    the next tile's K loads while this tile's scores are computed, its V while P V runs;
//  * online softmax in base 2, row sums kept per lane and reduced once at the end; P goes
//    from the score accumulators to the A operand of P V without leaving registers;
//  * only the last tiles of a block (keys past its first query position) are masked;
//  * blocks are launched longest-first.
// The prefix a block attends to is read once per K/V tile for all its 64 rows, so a long
// prompt costs O(P^2 / 64) tile reads, not one pass per query row.
//
// Parameters are `PrefillParams` (attention.cuh), with the same tiles / seq_meta / tables as the
// other prefill kernels (tiles step by 64 / G query tokens). Dynamic shared memory:
// flash_smem_bytes<64>() (the host raises the function's limit above 48 KB).

#include "flash.cuh"

namespace {

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

constexpr int ROWS = 64;

template <int G, typename KT>
__device__ void flash_prefill(const PrefillParams& p) {
  extern __shared__ __align__(1024) unsigned char fa_raw[];
  __nv_bfloat16* sq = flash_smem(fa_raw);
  __nv_bfloat16* sk = sq + ROWS * HD;    // [2][FA_TILE]
  __nv_bfloat16* sv = sk + 2 * FA_TILE;  // [2][FA_TILE]
  const KT* k_cache = (const KT*)p.k_cache;  // bf16, or fp8 (dequantized into the tiles)
  const KT* v_cache = (const KT*)p.v_cache;
  const int nh = p.nkv * G;
  const FlashTile t = flash_tile<G, ROWS>(p, 1);
  const int lane = threadIdx.x % 32, wrow = (threadIdx.x / 32) * 16;
  const int gr = lane / 4, tq = lane % 4;
  const int pos0 = t.q_first + (wrow + gr) / G, pos1 = t.q_first + (wrow + gr + 8) / G;

  // Q with K tile 0 (group 0), V tile 0 (group 1).
  FlashLoader<THREADS> ld(threadIdx.x);
  ld.q<G, ROWS>((const __nv_bfloat16*)p.q, t, nh, sq);
  ld.slots(t, 0, p.block_size);
  ld.tile(k_cache, p.k_scale, p.k_new, sk);
  cp_async_commit();
  ld.tile(v_cache, p.v_scale, p.v_new, sv);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  // Q fragments (A operand), 8 k-steps of 16 dims.
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    int r = wrow + (lane & 7) + ((lane >> 3) & 1) * 8, c = kk * 16 + (lane >> 4) * 8;
    ldsm_x4(smem_addr(sq + sw128<ROWS>(r, c)), qf[kk]);
  }

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  FlashRows st;

  for (int j = 0; j < t.n_tiles; ++j) {
    const int buf = j & 1;
    const __nv_bfloat16* kt = sk + buf * FA_TILE;
    const __nv_bfloat16* vt = sv + buf * FA_TILE;
    // Next K tile into the other buffer (its last readers passed the barrier that ended the
    // previous iteration).
    if (j + 1 < t.n_tiles) {
      ld.slots(t, j + 1, p.block_size);
      ld.tile(k_cache, p.k_scale, p.k_new, sk + (buf ^ 1) * FA_TILE);
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
        ldsm_x4(smem_addr(kt + sw128(r, c)), b);
        mma_bf16(s[2 * np], qf[kk], b[0], b[1]);
        mma_bf16(s[2 * np + 1], qf[kk], b[2], b[3]);
      }
    }
    const int k0 = j * FA_BK;
    uint32_t pf[FA_BK / 16][4];
    flash_softmax(s, o, st, pf, k0, k0 + FA_BK - 1 > t.q_first, pos0, pos1, tq);

    // V tile j is the older of the two groups in flight (K j+1 is the newer).
    cp_async_wait<1>();
    __syncthreads();
    if (j + 1 < t.n_tiles) ld.tile(v_cache, p.v_scale, p.v_new, sv + (buf ^ 1) * FA_TILE);
    cp_async_commit();

    // O += P V: 4 steps of 16 keys, 8 pairs of 8-dim blocks.
#pragma unroll
    for (int kk = 0; kk < FA_BK / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t b[4];
        int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = dp * 16 + (lane >> 4) * 8;
        ldsm_x4_t(smem_addr(vt + sw128(r, c)), b);
        mma_bf16(o[2 * dp], pf[kk], b[0], b[1]);
        mma_bf16(o[2 * dp + 1], pf[kk], b[2], b[3]);
      }
    }
    // K tile j + 1 is now the older group in flight.
    cp_async_wait<1>();
    __syncthreads();
  }
  cp_async_wait<0>();
  flash_store<G, ROWS>(o, st, t, nh, sq, (__nv_bfloat16*)p.out);
}

}  // namespace

// Two blocks per SM (81 KB of shared memory and at most 255 registers a thread each).
// `_fp8`: bf16 compute over fp8 caches.
#define PS_FLASH_PREFILL(G, KT, NAME)                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS, 2)                                      \
      flash_prefill_g##G##_##NAME(const PrefillParams p) {                                      \
    pdl_entry();                                                                                \
    flash_prefill<G, KT>(p);                                                                    \
  }
PS_FLASH_PREFILL(1, __nv_bfloat16, bf16)
PS_FLASH_PREFILL(2, __nv_bfloat16, bf16)
PS_FLASH_PREFILL(4, __nv_bfloat16, bf16)
PS_FLASH_PREFILL(8, __nv_bfloat16, bf16)
PS_FLASH_PREFILL(1, fp8, fp8)
PS_FLASH_PREFILL(2, fp8, fp8)
PS_FLASH_PREFILL(4, fp8, fp8)
PS_FLASH_PREFILL(8, fp8, fp8)
