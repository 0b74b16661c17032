// The 1-row plain skinny matmul with its weights streamed into shared memory by the copy
// engine (LaunchOptions::gemv_tma; sm_90): one block per SM, 8 compute warps and a copy warp.
// Compute warp w of the grid's NW takes rows w, w + NW, ...; lane w of the copy warp copies
// that warp's rows, in pieces of 1,024 inputs (2 KB, cp.async.bulk, evict-first in L2), into
// a ring of `ns` slots (a full and an empty mbarrier a slot), starting before the wait on the
// kernel before (weights only; PDL). The warp sums each row as gemv.cuh's dot_rows does (lane
// l takes chunks l, l + 32, ... in order, then the warp's butterfly): the same bits as the
// skinny matmuls of gemv.cu. K is a multiple of 1,024.
//
// gemv_tma_argmax (LaunchOptions::gemv_tma_head_argmax): the same matmul for a greedy step's
// lm_head, which writes each logit as f32 (rounded to bf16 first, as the bf16 matmul then
// to_f32 give it) and the row's argmax in the same launch: each warp keeps its best row, each
// block its warps' best, and the block that finishes last merges the blocks' bests into
// ids[0] (and feed[0]) as layer_ops.cu's to_f32_argmax does (the best value's lowest index;
// NaN never wins; no finite or infinite value: 0).

#include "gemv.cuh"

namespace {

constexpr int ST = WARPS * 32;  // compute threads a block
constexpr int PIECE = 1024;     // inputs a weight piece (4 chunks a lane)
constexpr int PIECE_BYTES = PIECE * 2;
constexpr int MAX_NS = 10;  // ring slots a warp at most

__device__ __forceinline__ uint32_t saddr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// Whether the mbarrier's phase of this parity has completed; `wait`: the potentially
// blocking try_wait, else the non-blocking test_wait.
template <bool WAIT>
__device__ __forceinline__ bool mbar_done(uint64_t* b, uint32_t parity) {
  uint32_t ok;
  if (WAIT)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(ok)
        : "r"(saddr(b)), "r"(parity)
        : "memory");
  else
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(ok)
        : "r"(saddr(b)), "r"(parity)
        : "memory");
  return ok != 0;
}

// Lane w (< 8) of the copy warp: compute warp gw's pieces in order, each once its slot's
// previous piece is summed. The eight lanes poll without blocking and stay converged.
__device__ void produce(const __nv_bfloat16* W, int N, int K, __nv_bfloat16* slots,
                        uint64_t* full, uint64_t* empty, int ns, int gw, int NW) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  const int P = K / PIECE;
  const int total = gw < N ? ((N - 1 - gw) / NW + 1) * P : 0;
  int issued = 0;
  while (__any_sync(0xffu, issued < total)) {
    if (issued >= total) continue;
    const int s = issued % ns;
    if (issued >= ns && !mbar_done<false>(empty + s, (uint32_t)(issued / ns - 1) & 1u)) continue;
    const int row = gw + (issued / P) * NW;
    const __nv_bfloat16* src = W + (size_t)row * K + (size_t)(issued % P) * PIECE;
    const uint32_t bar = saddr(full + s);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                 "r"(PIECE_BYTES)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1], %2, [%3], %4;" ::"r"(saddr(slots + (size_t)s * PIECE)),
        "l"(src), "r"(PIECE_BYTES), "r"(bar), "l"(policy)
        : "memory");
    ++issued;
  }
}

// Where gemv_tma_argmax puts its answer: the f32 logits, the blocks' bests (gridDim.x each),
// the counter of finished blocks (zero between launches), the ids and the feed (or null).
struct Greedy {
  float* logits;
  float* pv;
  int* pi;
  uint32_t* counter;
  uint32_t* ids;
  uint32_t* feed;
};

// The compute warps' end of gemv_tma_argmax: (best, idx) is lane 0's pick of its warp's rows.
__device__ void greedy_merge(float best, int idx, const Greedy& g) {
  __shared__ float wv[WARPS];
  __shared__ int wi[WARPS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) { wv[warp] = best; wi[warp] = idx; }
  asm volatile("bar.sync 1, %0;" ::"r"(ST) : "memory");
  if (warp != 0) return;
  float v = lane < WARPS ? wv[lane] : -INFINITY;
  int i = lane < WARPS ? wi[lane] : 0x7fffffff;
  warp_argmax(v, i);
  uint32_t last = 0;
  if (lane == 0) {
    g.pv[blockIdx.x] = v;
    g.pi[blockIdx.x] = i;
    __threadfence();
    last = atomicAdd(g.counter, 1u) == gridDim.x - 1;
  }
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  __threadfence();
  v = -INFINITY;
  i = 0x7fffffff;
  for (int q = lane; q < (int)gridDim.x; q += 32) {
    const float qv = reinterpret_cast<volatile float*>(g.pv)[q];
    const int qi = reinterpret_cast<volatile int*>(g.pi)[q];
    if (before(qv, qi, v, i)) { v = qv; i = qi; }
  }
  warp_argmax(v, i);
  if (lane == 0) {
    const uint32_t id = i == 0x7fffffff ? 0u : (uint32_t)i;
    g.ids[0] = id;
    if (g.feed != nullptr) g.feed[0] = id;
    *g.counter = 0;  // ready for the next launch (a graph's next replay)
  }
}

// ARGMAX: out is unused and the logits and the argmax go to `greedy` (gemv_tma_argmax).
template <bool ARGMAX>
__device__ void tma_gemv(const __nv_bfloat16* __restrict__ W, const __nv_bfloat16* x,
                         __nv_bfloat16* out, int N, int K, int ns, const Greedy& greedy) {
  extern __shared__ __align__(128) __nv_bfloat16 dyn[];
  __shared__ __align__(8) uint64_t full[WARPS][MAX_NS], empty[WARPS][MAX_NS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int NW = gridDim.x * WARPS, gw = blockIdx.x * WARPS + warp;
  __nv_bfloat16* x_s = dyn + (size_t)WARPS * ns * PIECE;
  pdl_trigger();
  if (warp == WARPS) {
    if (lane < WARPS)
      for (int s = 0; s < ns; ++s) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[lane][s])) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&empty[lane][s])) : "memory");
      }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    if (lane < WARPS)
      produce(W, N, K, dyn + (size_t)lane * ns * PIECE, full[lane], empty[lane], ns,
              blockIdx.x * WARPS + lane, NW);
    return;
  }
  __syncthreads();  // the mbarriers are initialised
  pdl_wait();
  for (int i = threadIdx.x; i < K / 8; i += ST)
    reinterpret_cast<uint4*>(x_s)[i] = reinterpret_cast<const uint4*>(x)[i];
  asm volatile("bar.sync 1, %0;" ::"r"(ST) : "memory");
  const int P = K / PIECE;
  __nv_bfloat16* slots = dyn + (size_t)warp * ns * PIECE;
  int used = 0;
  float best = -INFINITY;
  int idx = 0x7fffffff;
  for (int row = gw; row < N; row += NW) {
    float acc = 0.f;
    for (int pc = 0; pc < P; ++pc, ++used) {
      const int s = used % ns;
      while (!mbar_done<true>(&full[warp][s], (uint32_t)(used / ns) & 1u)) {
      }
      const __nv_bfloat16* w = slots + (size_t)s * PIECE;
#pragma unroll
      for (int i = 0; i < PIECE / 256; ++i) {
        const int c = lane + 32 * i;
        float wf[8], xf[8];
        bf16x8_to_f32(reinterpret_cast<const uint4*>(w)[c], wf);
        bf16x8_to_f32(reinterpret_cast<const uint4*>(x_s)[pc * (PIECE / 8) + c], xf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc = fmaf(wf[j], xf[j], acc);
      }
      __syncwarp();
      if (lane == 0)
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&empty[warp][s]))
                     : "memory");
    }
    acc = warp_sum(acc);
    if (!ARGMAX) {
      if (lane == 0) out[row] = __float2bfloat16(acc);
    } else if (lane == 0) {
      const float v = __bfloat162float(__float2bfloat16(acc));
      greedy.logits[row] = v;
      if (v > best) { best = v; idx = row; }  // rows ascend: ties keep the lowest
    }
  }
  if (ARGMAX) greedy_merge(best, idx, greedy);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(WARPS * 32 + 32, 1)
    gemv_tma(const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* out, int N, int K,
             int ns) {
  tma_gemv<false>(W, x, out, N, K, ns, Greedy{});
}

extern "C" __global__ void __launch_bounds__(WARPS * 32 + 32, 1)
    gemv_tma_argmax(const __nv_bfloat16* W, const __nv_bfloat16* x, float* logits, int N, int K,
                    int ns, float* pv, int* pi, uint32_t* counter, uint32_t* ids,
                    uint32_t* feed) {
  tma_gemv<true>(W, x, nullptr, N, K, ns, Greedy{logits, pv, pi, counter, ids, feed});
}
