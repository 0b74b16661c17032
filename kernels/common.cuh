// Device helpers every kernel file of `kernels/` shares (included, compiled into each fatbin).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#ifdef BLOCK_TIMELINE
// The block timeline (the `timeline` cargo feature, a profiling build: `examples/graph_check
// --timeline`): thread 0 of each block of a kernel that calls pdl_trigger and then pdl_wait
// takes a record slot at its start (one atomic on this module's counter, before the wait, so
// the wait's side only reads the clock and stores) and writes {start ns, wait released ns, SM
// << 32 | block, grid x | y << 16 | z << 24 | threads << 32} once past its wait. A file that
// defines TL_SLOTS (> 1) before this header takes that many slots a block and marks phases
// 1..TL_SLOTS-1 with tl_mark: {0, ns, SM << 32 | block, grid | 1 << 63 | phase << 56}. The host
// sets tl_buf (null: off), tl_cap and tl_n per module (src/engine/cuda/timeline.rs).
#ifndef TL_SLOTS
#define TL_SLOTS 1
#endif
extern "C" {
__device__ unsigned long long* tl_buf;
__device__ unsigned int tl_cap;
__device__ unsigned int tl_n;
}
__shared__ unsigned long long tl_t0;
__shared__ unsigned int tl_i, tl_tag, tl_ok;

__device__ __forceinline__ unsigned long long tl_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ bool tl_thread() {
  return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}
__device__ __forceinline__ unsigned int tl_block() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
__device__ __forceinline__ unsigned long long tl_grid() {
  return gridDim.x | ((unsigned long long)gridDim.y << 16) | ((unsigned long long)gridDim.z << 24) |
         ((unsigned long long)(blockDim.x * blockDim.y * blockDim.z) << 32);
}
__device__ __forceinline__ unsigned long long tl_where() {
  unsigned int sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return ((unsigned long long)sm << 32) | tl_block();
}
// Phase `p` (1..TL_SLOTS-1) of a block that recorded its wait: by thread 0, after whatever
// barrier ends the phase. The clock is read first: the tests below load tl_cap, which after an
// acquire (a cluster barrier's wait, an mbarrier's) misses L1 and took up to ~1 us (rounds
// 54-55 read it before the clock).
__device__ __forceinline__ void tl_mark(unsigned int p) {
  const unsigned long long now = tl_now();
  if (tl_thread() && tl_ok == (tl_block() ^ 0xa5a50000u) && p < TL_SLOTS && tl_i + p < tl_cap) {
    ulonglong2* rec = reinterpret_cast<ulonglong2*>(tl_buf) + 2 * (size_t)(tl_i + p);
    rec[0] = make_ulonglong2(0ull, now);
    rec[1] = make_ulonglong2(tl_where(), tl_grid() | (1ull << 63) | ((unsigned long long)p << 56));
  }
}
#define TL_MARK(p) tl_mark(p)
#else
#define TL_MARK(p)
#endif

namespace {

// Whether (v, i) comes before (bv, bi) in an argmax's order: the larger value, then the lower
// index.
__device__ __forceinline__ bool before(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

// The warp's first (best, idx) in `before`'s order, in every lane. (The test is spelled out:
// through `before`, ptxas gave moe_route.cu's and layer_ops.cu's kernels other machine code.)
__device__ __forceinline__ void warp_argmax(float& best, int& idx) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ob > best || (ob == best && oi < idx)) { best = ob; idx = oi; }
  }
}

// Programmatic dependent launch (see src/engine/cuda/launch.rs), in two halves:
//  * pdl_trigger: the next kernel on the stream may launch now (its blocks then sit at their
//    own pdl_wait, or prefetch weights before it);
//  * pdl_wait: blocks until the kernel before this one finished and its writes are visible.
// Before pdl_wait a kernel may only read memory no kernel of the step writes (weights);
// nothing on GPUs before sm_90.
__device__ __forceinline__ void pdl_trigger() {
#ifdef BLOCK_TIMELINE
  if (tl_thread()) {
    tl_t0 = tl_now();
    tl_i = tl_buf != nullptr ? atomicAdd(&tl_n, (unsigned int)TL_SLOTS) : 0xffffffffu;
    tl_ok = 0;
    tl_tag = tl_block() ^ 0x5a5a0000u;
  }
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef BLOCK_TIMELINE
  // Only a block whose thread 0 took its slot in pdl_trigger (the tag: not a slot left in
  // shared memory by another block) records; the clock first (see tl_mark).
  const unsigned long long now = tl_now();
  if (tl_thread() && tl_tag == (tl_block() ^ 0x5a5a0000u) && tl_i < tl_cap) {
    ulonglong2* rec = reinterpret_cast<ulonglong2*>(tl_buf) + 2 * (size_t)tl_i;
    rec[0] = make_ulonglong2(tl_t0, now);
    rec[1] = make_ulonglong2(tl_where(), tl_grid());
    tl_tag = 0;
    tl_ok = tl_block() ^ 0xa5a50000u;
  }
#endif
}

// Both, first thing in a kernel that reads nothing before waiting.
__device__ __forceinline__ void pdl_entry() {
  pdl_trigger();
  pdl_wait();
}

// Prefetches this block's share of the `bytes` bytes at `p` into L2, one bulk prefetch per warp
// (sm_90+; nothing before): weights a later kernel of the step reads, streamed from memory
// while this kernel runs, so that kernel finds them in L2. `bytes` is a multiple of 16 and `p`
// 16-byte aligned (bf16 weight rows of a multiple of 8).
__device__ __forceinline__ void l2_prefetch_share(const void* p, unsigned long long bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (bytes == 0 || (threadIdx.x & 31) != 0) return;
  const unsigned long long warps = blockDim.x / 32;
  const unsigned long long parts = (unsigned long long)gridDim.x * warps;
  const unsigned long long part = ((bytes + parts - 1) / parts + 15) & ~15ull;
  const unsigned long long off = ((unsigned long long)blockIdx.x * warps + threadIdx.x / 32) * part;
  if (off >= bytes) return;
  const unsigned n = (unsigned)(bytes - off < part ? bytes - off : part);
  asm volatile(
      "{\n .reg .u64 g;\n cvta.to.global.u64 g, %0;\n"
      " cp.async.bulk.prefetch.L2.global [g], %1;\n}" ::"l"((const char*)p + off),
      "r"(n)
      : "memory");
#endif
}

// Sum over a full warp (every lane gets the result).
// a[i] of an array held in registers, for a run-time i < N: an unrolled select, so the array
// is never indexed through local memory (loads issued early into such arrays are picked so).
template <typename T, int N>
__device__ __forceinline__ T reg_pick(const T (&a)[N], int i) {
  T v = a[0];
#pragma unroll
  for (int e = 1; e < N; ++e)
    if (e == i) v = a[e];
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block of up to 1024 threads (every thread gets the result), in one fixed order:
// each warp's butterfly, then warp 0's over the warps' sums. Called at most once a kernel
// (its shared result is not guarded against a second call).
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int nw = (blockDim.x + 31) >> 5;
    float s = lane < nw ? part[lane] : 0.f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

// d += a (16x16, row) * b (16x8, col) as mma.sync m16n8k16: bf16 in, f32 accumulation (sm_80+).
// Fragments: a0/a2 row g = lane / 4, a1/a3 row g + 8, k pairs (2c, 2c + 1) and (2c + 8, 2c + 9)
// for c = lane % 4; b0/b1 column g, the same k pairs; d0/d1 row g, d2/d3 row g + 8, columns 2c
// and 2c + 1.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Eight bf16 (one 16-byte load) as f32.
__device__ __forceinline__ void bf16x8_to_f32(uint4 raw, float* out) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// fp8 KV (e4m3, `src/engine/kv_format.rs`): a stored value is x / scale saturated at +-448;
// kernels read it back as stored * scale in registers (K's scale is folded into q).
using fp8 = __nv_fp8_e4m3;

template <typename KT>
struct IsFp8 {
  static constexpr bool value = false;
};
template <>
struct IsFp8<fp8> {
  static constexpr bool value = true;
};

// A K or V element as the cache stores it: the compute dtype as is, e4m3 as x * inv (inv =
// 1 / scale) with saturation.
template <typename KT>
__device__ __forceinline__ KT kv_store(float x, float inv) {
  if constexpr (IsFp8<KT>::value) {
    KT r;
    r.__x = __nv_cvt_float_to_fp8(x * inv, __NV_SATFINITE, __NV_E4M3);
    return r;
  } else {
    return from_f<KT>(x);
  }
}

// One q or k head of one token, by one warp: RMSNorm over the head (weight w), then RoPE
// (rotate-half) at position pos. Lane l holds elements l + 32 * j of the head
// (head_dim = 32 * PER), so the rotate-half pairs (i, i + hd/2) sit in one lane; o[j] is
// element lane + 32 * j. cos/sin in f32 from inv_freq [hd/2]. The unfused
// qk_norm_rope_kv_write and the fused decode attention both use it, so both give the same bits.
template <typename T, int PER>
__device__ __forceinline__ void norm_rope_head(const T* __restrict__ src, const T* __restrict__ w,
                                               const float* __restrict__ inv_freq, float pos,
                                               float eps, int lane, float (&o)[PER]) {
  constexpr int HD = 32 * PER;
  float v[PER];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    v[j] = to_f(src[lane + 32 * j]);
    ss += v[j] * v[j];
  }
  const float inv = rsqrtf(warp_sum(ss) / HD + eps);
#pragma unroll
  for (int j = 0; j < PER; ++j) v[j] = v[j] * inv * to_f(w[lane + 32 * j]);
#pragma unroll
  for (int j = 0; j < PER / 2; ++j) {
    const int i = lane + 32 * j;  // i < hd/2; its partner is i + hd/2 = element j + PER/2
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    const float a = v[j], b = v[j + PER / 2];
    o[j] = a * c - b * s;
    o[j + PER / 2] = b * c + a * s;
  }
}

}  // namespace
