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

#include "decode_mma.cuh"

namespace {

template <typename KT, int G, int DEPTH, bool SPLIT>
__device__ void paged_decode_mma(const DecodeParams& p) {
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
  const MmaTable tb = mma_table(p.block_tables + (size_t)b * W, p.block_size, start);
  const size_t head_base = (size_t)kh * (size_t)p.num_slots;
  const KT* kc = (const KT*)p.k_cache;
  const KT* vc = (const KT*)p.v_cache;

  // q's fragment: row gr (query head kh * G + gr), the lane's pairs of dims; rows >= G zero.
  uint32_t qa[16];
  mma_q_frags<KT, G>((const __nv_bfloat16*)p.q + ((size_t)b * nh + kh * G) * HD, gr, t, qa);
  const float sc = p.k_scale * LOG2E;
  MmaState st;
  mma_state_empty(st);

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

  // Merge the warps through shared memory.
  MmaWarps<G>& mw = *reinterpret_cast<MmaWarps<G>*>(dsm);
  static_assert(MMA_WARPS_BYTES <= MMA_WARPS * 2 * stage_bytes<fp8>(),
                "the merge fits in the stages' shared memory");
  mma_store_warp<KT, G>(st, p.v_scale, warp, gr, t, mw);
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * HD; idx += MMA_WARPS * 32) {
    const int g = idx / HD, d = idx % HD, h = kh * G + g;
    float M, Lsum, A;
    mma_merge_warps<G>(mw, g, d, M, Lsum, A);
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
