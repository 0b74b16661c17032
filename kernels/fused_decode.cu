// The fused decode attention's kernels (fused_decode.cuh): the CUDA-core ones (by division and
// lean) and the tensor-core ones of 1 and 2 stages, GQA groups 1, 2, 4, 8, bf16 and fp8 caches.
#define TL_SLOTS 7
#include "fused_decode.cuh"

#define PS_DECODE_FUSED(G, KT, NAME, LEAN, MMA, BOUNDS, PRE)                                    \
  extern "C" __global__ void BOUNDS                                                             \
      decode_fused##PRE##_g##G##_##NAME(const FusedDecodeParams p) {                            \
    decode_fused<G, KT, LEAN, MMA>(p.qkv, p.q_w, p.k_w, p.inv_freq, p.pos, p.slots,             \
                                   (KT*)p.k_cache, (KT*)p.v_cache, p.block_tables, p.ctx_lens,   \
                                   p.out, p.part_acc, p.part_ml, p.counters, p.W, p.width,       \
                                   p.block_size, p.num_slots, p.nkv, p.part, p.k_scale,          \
                                   p.v_scale, p.eps, p.stop, p.kv_shift);                        \
  }
#define PS_DECODE_FUSED_ALL(LEAN, MMA, BOUNDS, PRE)                  \
  PS_DECODE_FUSED(1, __nv_bfloat16, bf16, LEAN, MMA, BOUNDS, PRE)   \
  PS_DECODE_FUSED(2, __nv_bfloat16, bf16, LEAN, MMA, BOUNDS, PRE)   \
  PS_DECODE_FUSED(4, __nv_bfloat16, bf16, LEAN, MMA, BOUNDS, PRE)   \
  PS_DECODE_FUSED(8, __nv_bfloat16, bf16, LEAN, MMA, BOUNDS, PRE)   \
  PS_DECODE_FUSED(1, fp8, fp8, LEAN, MMA, BOUNDS, PRE)              \
  PS_DECODE_FUSED(2, fp8, fp8, LEAN, MMA, BOUNDS, PRE)              \
  PS_DECODE_FUSED(4, fp8, fp8, LEAN, MMA, BOUNDS, PRE)              \
  PS_DECODE_FUSED(8, fp8, fp8, LEAN, MMA, BOUNDS, PRE)
PS_DECODE_FUSED_ALL(false, 0, __launch_bounds__(THREADS), )
// The same with LaunchOptions::fused_lean (the same bits).
PS_DECODE_FUSED_ALL(true, 0, __launch_bounds__(THREADS), _lean)
// Step 3 on tensor cores where a context fits one cluster (LaunchOptions::fused_mma) with 1 or
// 2 stages a warp: dynamic shared memory of max(MMA_WARPS * stages * stage_bytes,
// MMA_STATES_BYTES) (attention_handles.rs).
PS_DECODE_FUSED_ALL(true, 1, __launch_bounds__(THREADS, 4), _mma1)
PS_DECODE_FUSED_ALL(true, 2, __launch_bounds__(THREADS, 2), _mma2)
