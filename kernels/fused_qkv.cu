// The fused decode attention with the qkv matmul inside (fused_qkv.cuh;
// LaunchOptions::fused_qkv): the 1-row tensor-core kernels of GQA group 2 (1 and 2 stages, bf16
// and fp8 caches), sm_90 only (bulk copies, st.async), one block an SM (the weights' shared
// memory). At most 128 registers a thread, as the default 1-stage kernels: a block then fits
// beside the two blocks an SM of the down matmul before it (90 registers), so it starts, and
// its weight copy with it, before that kernel ends (the 1-stage bf16 kernel spills 68 bytes).
#define TL_SLOTS 7
#include "fused_decode.cuh"

#define PS_FUSED_QKV(KT, NAME, MMA)                                                          \
  extern "C" __global__ void __launch_bounds__(THREADS, 4)                                   \
      decode_fused_qkv_mma##MMA##_g2_##NAME(const FusedQkvParams p) {                        \
    decode_fused<2, KT, true, MMA, true>(                                                    \
        p.d.qkv, p.d.q_w, p.d.k_w, p.d.inv_freq, p.d.pos, p.d.slots, (KT*)p.d.k_cache,       \
        (KT*)p.d.v_cache, p.d.block_tables, p.d.ctx_lens, p.d.out, p.d.part_acc, p.d.part_ml, \
        p.d.counters, p.d.W, p.d.width, p.d.block_size, p.d.num_slots, p.d.nkv, p.d.part,    \
        p.d.k_scale, p.d.v_scale, p.d.eps, p.d.stop, p.d.kv_shift, p.q);                     \
  }
PS_FUSED_QKV(__nv_bfloat16, bf16, 1)
PS_FUSED_QKV(__nv_bfloat16, bf16, 2)
PS_FUSED_QKV(fp8, fp8, 1)
PS_FUSED_QKV(fp8, fp8, 2)
