// Flash prefill attention over the paged caches on Hopper's warpgroup MMA (bf16, sm_90a): the
// design of flash_prefill.cu (flash.cuh: tiles, loads, online softmax, output) with the two
// products on wgmma: S = Q K^T reads Q and K straight from shared memory (K-major,
// 128-byte-swizzled tiles, one descriptor per 16-dim step), O += P V takes P from registers
// and V from shared memory (MN-major: V is stored keys x dims, as the caches hold it). A block
// is two warpgroups and 128 query rows (each warpgroup 64 of them): every K/V tile read from
// L2 serves 128 rows, half the traffic of 64-row blocks, which bounded the 64-row kernel at
// long prompts (~3.6 TB/s of K/V reads). Each product is issued asynchronously and waited
// for once per tile. Compiled for sm_90a only (build.rs); the host
// loads it on sm_90 GPUs and takes flash_prefill.cu elsewhere.

#include "flash.cuh"

namespace {

constexpr int ROWS = 128;          // query rows of a block
constexpr int NT = 2 * THREADS;    // two warpgroups

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A shared-memory matrix descriptor of a 128-byte-swizzled tile: start address, leading and
// stride byte offsets (16-byte units), swizzle mode 1 (128 B) in bits 62-63.
__device__ __forceinline__ uint64_t sw128_desc(const __nv_bfloat16* p, uint32_t lbo,
                                               uint32_t sbo) {
  uint32_t a = smem_addr(p);
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
         ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

// K-major operand (64 rows of a tile of `rows` rows x 128 dims, from row r0): 16-dim step kk
// starts 32 bytes into its 64-dim half; 8-row groups are 1024 bytes apart.
__device__ __forceinline__ uint64_t k_major(const __nv_bfloat16* tile, int rows, int r0,
                                            int kk) {
  return sw128_desc(tile + (kk / 4) * (rows * 64) + r0 * 64 + (kk % 4) * 16, 16, 1024);
}

// MN-major operand (V, 64 keys x 128 dims): 16-key step kk starts at row 16 kk; the two
// 64-dim halves are 8 KB apart (leading), 8-key groups 1024 bytes (stride).
__device__ __forceinline__ uint64_t mn_major(const __nv_bfloat16* tile, int kk) {
  return sw128_desc(tile + kk * 16 * 64, FA_BK * 64 * 2, 1024);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Generic-proxy writes (cp.async) made visible to the async proxy (wgmma's operand reads).
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from touching accumulators between an async MMA and its wait.
template <int N>
__device__ __forceinline__ void reg_fence(float (&x)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(x[i][e])::"memory");
}

// d (64x64 f32, the accumulator layout) (+)= A (smem, K-major) * B (smem, K-major), k16.
__device__ __forceinline__ void wgmma_s(float (&d)[FA_BK / 8][4], uint64_t a, uint64_t b,
                                        int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a), "l"(b), "r"(accumulate));
}

// d (64x128 f32) += A (registers, the m16n8k16 A layout per warp) * B (smem, MN-major), k16.
__device__ __forceinline__ void wgmma_pv(float (&d)[HD / 8][4], const uint32_t (&a)[4],
                                         uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

template <int G, typename KT>
__device__ void flash_prefill_wgmma(const PrefillParams& p) {
  extern __shared__ __align__(1024) unsigned char fa_raw[];
  __nv_bfloat16* sq = flash_smem(fa_raw);
  __nv_bfloat16* sk = sq + ROWS * HD;    // [2][FA_TILE]
  __nv_bfloat16* sv = sk + 2 * FA_TILE;  // [2][FA_TILE]
  const KT* k_cache = (const KT*)p.k_cache;  // bf16, or fp8 (dequantized into the tiles)
  const KT* v_cache = (const KT*)p.v_cache;
  const int nh = p.nkv * G;
  const int splits = max(p.splits, 1);
  const FlashTile t = flash_tile<G, ROWS>(p, splits);
  int j0, j1;
  flash_split_range(t, splits, j0, j1);
  const int lane = threadIdx.x % 32, wrow = (threadIdx.x / 32) * 16;
  const int gr = lane / 4, tq = lane % 4;
  const int pos0 = t.q_first + (wrow + gr) / G, pos1 = t.q_first + (wrow + gr + 8) / G;
  const int r0 = (threadIdx.x / 128) * 64;  // this warpgroup's first row

  FlashLoader<NT> ld(threadIdx.x);
  ld.q<G, ROWS>((const __nv_bfloat16*)p.q, t, nh, sq);
  ld.slots(t, j0, p.block_size);
  ld.tile(k_cache, p.k_scale, p.k_new, sk);
  cp_async_commit();
  ld.tile(v_cache, p.v_scale, p.v_new, sv);
  cp_async_commit();
  cp_async_wait<1>();
  fence_async_smem();
  __syncthreads();

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  FlashRows st;

  for (int j = j0; j < j1; ++j) {
    const int buf = (j - j0) & 1;
    const __nv_bfloat16* kt = sk + buf * FA_TILE;
    const __nv_bfloat16* vt = sv + buf * FA_TILE;
    if (j + 1 < j1) {
      ld.slots(t, j + 1, p.block_size);
      ld.tile(k_cache, p.k_scale, p.k_new, sk + (buf ^ 1) * FA_TILE);
    }
    cp_async_commit();

    // S = Q K^T (64 rows x 64 keys for the warpgroup; 16 x 64 per warp).
    float s[FA_BK / 8][4];
#pragma unroll
    for (int n = 0; n < FA_BK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    reg_fence(s);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) wgmma_s(s, k_major(sq, ROWS, r0, kk), k_major(kt, FA_BK, 0, kk), kk);
    wg_commit();
    wg_wait();
    reg_fence(s);

    const int k0 = j * FA_BK;
    uint32_t pf[FA_BK / 16][4];
    flash_softmax(s, o, st, pf, k0, k0 + FA_BK - 1 > t.q_first, pos0, pos1, tq);

    // V tile j is the older of the two groups in flight (K j+1 is the newer).
    cp_async_wait<1>();
    fence_async_smem();
    __syncthreads();
    if (j + 1 < j1) ld.tile(v_cache, p.v_scale, p.v_new, sv + (buf ^ 1) * FA_TILE);
    cp_async_commit();

    // O += P V.
    reg_fence(o);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < FA_BK / 16; ++kk) wgmma_pv(o, pf[kk], mn_major(vt, kk));
    wg_commit();
    wg_wait();
    reg_fence(o);

    // K tile j + 1 is now the older group in flight.
    cp_async_wait<1>();
    fence_async_smem();
    __syncthreads();
  }
  cp_async_wait<0>();
  if (splits > 1) {
    flash_store_partial<G>(o, st, t, p);
  } else {
    flash_store<G, ROWS>(o, st, t, nh, sq, (__nv_bfloat16*)p.out);
  }
}

#else

template <int G, typename KT>
__device__ void flash_prefill_wgmma(const PrefillParams&) {
  __trap();  // built for sm_90a only
}

#endif

}  // namespace

// Blocks of 8 warps and 97 KB of shared memory: one per SM (148 registers a thread), or two
// (capped at 128 registers: ptxas spills 4 bytes), the `_x2` kernels.
// `_fp8`: bf16 compute over fp8 caches.
#define PS_FLASH_PREFILL_SM90(G, BLOCKS, SUFFIX, KT, NAME)                                       \
  extern "C" __global__ void __launch_bounds__(NT, BLOCKS)                                      \
      flash_prefill_sm90##SUFFIX##_g##G##_##NAME(const PrefillParams p) {                       \
    pdl_entry();                                                                                \
    flash_prefill_wgmma<G, KT>(p);                                                              \
  }
#define PS_FLASH_PREFILL_SM90_ALL(KT, NAME)                                                      \
  PS_FLASH_PREFILL_SM90(1, 1, , KT, NAME)                                                        \
  PS_FLASH_PREFILL_SM90(2, 1, , KT, NAME)                                                        \
  PS_FLASH_PREFILL_SM90(4, 1, , KT, NAME)                                                        \
  PS_FLASH_PREFILL_SM90(8, 1, , KT, NAME)                                                        \
  PS_FLASH_PREFILL_SM90(1, 2, _x2, KT, NAME)                                                     \
  PS_FLASH_PREFILL_SM90(2, 2, _x2, KT, NAME)                                                     \
  PS_FLASH_PREFILL_SM90(4, 2, _x2, KT, NAME)                                                     \
  PS_FLASH_PREFILL_SM90(8, 2, _x2, KT, NAME)
PS_FLASH_PREFILL_SM90_ALL(__nv_bfloat16, bf16)
// fp8: one block per SM only (capped at 128 registers the tile dequantization spills ~300 bytes).
PS_FLASH_PREFILL_SM90(1, 1, , fp8, fp8)
PS_FLASH_PREFILL_SM90(2, 1, , fp8, fp8)
PS_FLASH_PREFILL_SM90(4, 1, , fp8, fp8)
PS_FLASH_PREFILL_SM90(8, 1, , fp8, fp8)

// The merge of split-KV partials (grid: tiles x KV heads, 256 threads).
#define PS_FLASH_MERGE(G)                                                                        \
  extern "C" __global__ void __launch_bounds__(NT)                                              \
      flash_merge_g##G##_bf16(const PrefillParams p) {                                          \
    pdl_entry();                                                                                \
    flash_merge<G, ROWS>(p);                                                                    \
  }
PS_FLASH_MERGE(1)
PS_FLASH_MERGE(2)
PS_FLASH_MERGE(4)
PS_FLASH_MERGE(8)
