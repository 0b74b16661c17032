// The decode layer kernel (LaunchOptions::layer_kernel): a whole dense Qwen3 layer of a pure
// decode step of T <= 2 rows (bf16 weights and KV cache, head_dim 128) in one launch of one
// block per SM, its phases separated by grid-wide barriers instead of kernel boundaries:
//
//  A. add + RMSNorm (every block norms the rows into shared memory) and the qkv matmul;
//  B. the attention of every (row, KV head, partition): q/k norm + RoPE, the new K/V written
//     to the cache, the online softmax over the partition, the partial into global scratch
//     (each half of a block, 128 threads, takes its own partitions);
//  C. the partitions' merge into the attention output;
//  D. the o matmul;
//  E. add + RMSNorm and the gate|up matmul with SiLU * up;
//  F. the down matmul (its output is the next layer's residual delta).
//
// In a step of five launches a layer (the default) each kernel waits for the whole grid
// before it (~2.5-4 us a launch in the chain on the H200 even with its weights in L2); here a
// phase waits at a barrier of one atomic a block. The weights stream as before: every block
// prefetches its share of the layer's weights into L2 before its first wait (up to a budget,
// in phase order), and each phase's first batch of weight loads is issued before the barrier
// that opens it. The next launch is let in (PDL) at the last phase.
//
// Bits: the same sums in the same order as the default kernels (gemv.cu's streamed rows, the
// same norms, fused_decode.cu's partitions and merge), so for contexts of up to 16 * 128
// tokens the layer's outputs equal the five launches' (16 partitions a sequence and KV head,
// as the clustered fused attention at batches 1-4); longer contexts take partitions of 128
// tokens (at most `splits`), merged in one level.
//
// Data written in one phase and read in a later one goes through L2 (ld.global.cg or staged
// into shared memory), never the non-coherent or L1 paths.

#include "gemv.cuh"
#include "attention.cuh"

struct LayerParams {
  const __nv_bfloat16* w_qkv;
  const __nv_bfloat16* w_o;
  const __nv_bfloat16* w_gu;    // gate | up, [2I, H]
  const __nv_bfloat16* w_down;  // [H, I]
  const __nv_bfloat16* in_norm;
  const __nv_bfloat16* post_norm;
  const __nv_bfloat16* q_w;  // q norm weight, pre-scaled by 1/sqrt(128)
  const __nv_bfloat16* k_w;
  const float* inv_freq;
  const __nv_bfloat16* res;      // the residual stream in
  const __nv_bfloat16* delta;    // the previous layer's down (with add)
  __nv_bfloat16* res1;           // res + delta (with add)
  const __nv_bfloat16* res_mid;  // the stream after the first add (res1, or res without add)
  __nv_bfloat16* res2;           // res_mid + o
  __nv_bfloat16* qkv;
  __nv_bfloat16* attn;
  __nv_bfloat16* o;
  __nv_bfloat16* act;
  __nv_bfloat16* down;
  const uint32_t* pos;
  const uint32_t* slots;
  __nv_bfloat16* k_cache;
  __nv_bfloat16* v_cache;
  const uint32_t* block_tables;
  const uint32_t* ctx_lens;
  const uint32_t* width;  // the tables' width on the device (graphs), or null: W
  float* part_acc;        // [T][nh][splits][128]
  float* part_ml;         // [T][nh][splits][2]
  unsigned long long* barrier;  // arrivals, only ever added to (see bar_base)
  long long num_slots;
  unsigned long long pf_bytes;  // L2 prefetch budget of the layer's weights
  int W;
  int block_size;
  int nkv;
  int splits;  // partial slots a (row, head) in the scratch
  int hidden;
  int inter;
  int add;
  float eps;
  float qk_eps;
  // Profiling only (0 in the engine): bits 0-2 stop after phase 1-5 (A-E), bit 3 skips every
  // phase's work (the barriers alone), bit 4 sleeps between barrier polls.
  int mode;
};
static_assert(sizeof(LayerParams) == 288, "LayerParams layout");
static_assert(offsetof(LayerParams, num_slots) == 232 && offsetof(LayerParams, W) == 248 &&
                  offsetof(LayerParams, eps) == 276,
              "LayerParams layout");

namespace {

constexpr int LT = WARPS * 32;  // threads a block (two halves of attention's THREADS)
constexpr int PHASES = 5;       // grid barriers a launch
constexpr int LFETCH = 4;       // tokens per half-warp whose K/V loads are in flight together
constexpr int MIN_SPLITS = 16;  // partitions of a context up to MIN_SPLITS * 128 tokens

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// The arrival count before this launch's first arrival: every launch adds PHASES * gridDim.x
// (the grid is the same for every launch on a counter), and the launches before this one have
// finished (PDL wait), while this one's blocks have added less than that.
__device__ __forceinline__ unsigned long long bar_base(const unsigned long long* bar) {
  const unsigned long long v = ld_acquire(bar);
  return v - v % ((unsigned long long)PHASES * gridDim.x);
}

// Every block of the grid has arrived here (the k-th barrier: target base + k * gridDim.x);
// the writes before it are visible after it (the block's writes ordered before thread 0's
// release by the block barrier, the others' after its acquire). `nap`: thread 0 sleeps
// between polls (profiling variant).
__device__ __forceinline__ void grid_sync(unsigned long long* bar, unsigned long long target,
                                          bool nap) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(bar) : "memory");
    while (ld_acquire(bar) < target) {
      if (nap) __nanosleep(32);
    }
  }
  __syncthreads();
}

// A launch that stops after phase k (profiling) adds the arrivals of the barriers it skips,
// so that every launch adds PHASES * gridDim.x.
__device__ __forceinline__ void stop_after(unsigned long long* bar, int k) {
  if (threadIdx.x == 0) atomicAdd(bar, (unsigned long long)(PHASES - k));
}

// Barrier of one half of the block (128 threads; ids 1 and 2, 0 is __syncthreads').
__device__ __forceinline__ void half_sync(int hi) {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + hi), "r"(THREADS) : "memory");
}

// Partitions of a context of ctx tokens (at most smax).
__device__ __forceinline__ int layer_splits(int ctx, int smax) {
  return min(smax, max(MIN_SPLITS, (ctx + 127) / 128));
}

// gemv.cuh's norm_rows (DEFER false) / norm_rows_deferred (true), the rows read through L2:
// the same arithmetic.
template <int T, bool DEFER>
__device__ void layer_norm(const __nv_bfloat16* res, const __nv_bfloat16* delta,
                           __nv_bfloat16* res_out, const __nv_bfloat16* __restrict__ w, float eps,
                           int add, int K, __nv_bfloat16* x_s, float (&inv)[T]) {
  float part[T];
#pragma unroll
  for (int t = 0; t < T; ++t) part[t] = 0.f;
  for (int k = threadIdx.x; k < K; k += LT) {
    const float wk = DEFER ? __bfloat162float(w[k]) : 0.f;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float v = __bfloat162float(__ldcg(res + (size_t)t * K + k));
      if (add) {
        const __nv_bfloat16 s = __float2bfloat16(v + __bfloat162float(__ldcg(delta + (size_t)t * K + k)));
        if (DEFER && blockIdx.x == 0) res_out[(size_t)t * K + k] = s;
        v = __bfloat162float(s);
      }
      x_s[t * K + k] = __float2bfloat16(DEFER ? v * wk : v);
      part[t] += v * v;
    }
  }
  block_inv_rms<T>(part, K, eps, inv);
  if constexpr (!DEFER) {
    for (int k = threadIdx.x; k < K; k += LT) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const __nv_bfloat16 r = x_s[t * K + k];
        if (add && blockIdx.x == 0) res_out[(size_t)t * K + k] = r;
        x_s[t * K + k] = __float2bfloat16(__bfloat162float(r) * inv[t] * __bfloat162float(w[k]));
      }
    }
    __syncthreads();
  }
}

// n bf16 (a multiple of 8) from global (through L2) into shared memory, then a block barrier.
__device__ __forceinline__ void stage(const __nv_bfloat16* src, int n, __nv_bfloat16* x_s) {
  for (int i = threadIdx.x; i < n / 8; i += LT)
    reinterpret_cast<uint4*>(x_s)[i] = __ldcg(reinterpret_cast<const uint4*>(src) + i);
  __syncthreads();
}

// This block's share of the layer's weights into L2, in phase order, up to p.pf_bytes.
__device__ __forceinline__ void prefetch_weights(const LayerParams& p, int nq, int nhd) {
  unsigned long long left = p.pf_bytes;
  const unsigned long long H = p.hidden, I = p.inter;
  const void* w[4] = {p.w_qkv, p.w_o, p.w_gu, p.w_down};
  const unsigned long long n[4] = {nq * H * 2, H * nhd * 2, 4 * I * H, 2 * H * I};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned long long b = (n[i] < left ? n[i] : left) & ~15ull;
    l2_prefetch_share(w[i], b);
    left -= b;
  }
}

// The (row, KV head, partition) of work item `it` of the attention phase, and its tokens.
struct Item {
  int b, kh, split, ctx, S, start, end;
};

__device__ __forceinline__ Item layer_item(const LayerParams& p, int it) {
  Item x;
  x.b = it / (p.nkv * p.splits);
  x.kh = (it / p.splits) % p.nkv;
  x.split = it % p.splits;
  x.ctx = (int)p.ctx_lens[x.b];
  x.S = layer_splits(x.ctx, p.splits);
  const int part = decode_part(x.ctx, x.S, 16);
  x.start = x.split < x.S ? x.split * part : x.ctx;
  x.end = min(x.ctx, x.start + part);
  return x;
}

// Before the wait: the K/V pages of this half's first work item into L2 (rows of earlier
// steps, and the page the new token goes to: a prefetch only reads).
__device__ __forceinline__ void prefetch_kv(const LayerParams& p, int W, int hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int it = hi * gridDim.x + blockIdx.x;  // the half's first item (in the first row)
  if (it < p.nkv * p.splits && (threadIdx.x % 32) == 0) {
    const Item x = layer_item(p, it);
    if (x.start >= x.end) return;
    const int bs = p.block_size, warp = (threadIdx.x % THREADS) / 32;
    const uint32_t* table = p.block_tables + (size_t)x.b * W;
    for (int pg = x.start / bs + warp; pg <= (x.end - 1) / bs; pg += THREADS / 32) {
      const int t0 = max(x.start, pg * bs), t1 = min(x.end, (pg + 1) * bs);
      const size_t slot = (size_t)table[pg] * bs + (t0 - pg * bs);
      const size_t off = ((size_t)x.kh * p.num_slots + slot) * HD;
      const unsigned bytes = (unsigned)(t1 - t0) * HD * 2;
      l2_prefetch(p.k_cache + off, bytes);
      l2_prefetch(p.v_cache + off, bytes);
    }
  }
#endif
}

// Phase B for one half of the block (128 threads, attention.cuh's geometry): its work items'
// partials, as fused_decode.cu's decode_fused phases 1-4 (bf16 caches).
template <int G>
__device__ void attention_phase(const LayerParams& p, int W, int items) {
  using T = __nv_bfloat16;
  const int hi = threadIdx.x / THREADS, tid = threadIdx.x % THREADS;
  const int grp = tid / LANES, lane = tid % LANES;
  const int nkv = p.nkv, nh = nkv * G;
  __shared__ __align__(16) T qs[2][G][HD];
  __shared__ __align__(16) T knew[2][HD];
  __shared__ __align__(16) T vnew[2][HD];
  __shared__ float sm[2][GROUPS][G], sl[2][GROUPS][G];
  __shared__ float sacc[2][GROUPS][G][HD];
  for (int it = hi * gridDim.x + blockIdx.x; it < items; it += 2 * gridDim.x) {
    const Item x = layer_item(p, it);
    if (x.start >= x.end) continue;  // past the context (a padding row: all of it)
    const int start = x.start, end = x.end, newp = x.ctx - 1, b = x.b, kh = x.kh;
    const uint32_t* table = p.block_tables + (size_t)b * W;
    const size_t head_base = (size_t)kh * p.num_slots;
    uint4 kr[LFETCH], vr[LFETCH];
    auto fetch = [&](int base) {
#pragma unroll
      for (int u = 0; u < LFETCH; ++u) {
        const int q = base + grp + GROUPS * u;
        if (q < end && q != newp) {
          const size_t slot = (size_t)table[q / p.block_size] * p.block_size + q % p.block_size;
          const size_t off = (head_base + slot) * HD + lane * PER;
          kr[u] = __ldcg(reinterpret_cast<const uint4*>(p.k_cache + off));
          vr[u] = __ldcg(reinterpret_cast<const uint4*>(p.v_cache + off));
        }
      }
    };
    fetch(start);
    // q heads into shared memory; the new key and value into the cache and shared memory.
    const bool holds_new = end == x.ctx;
    {
      const int warp = tid / 32, wl = tid % 32;
      const T* row = p.qkv + (size_t)b * (nh + 2 * nkv) * HD;
      const float pos = (float)p.pos[b];
      for (int h = warp; h < G + (holds_new ? 1 : 0); h += THREADS / 32) {
        const bool is_q = h < G;
        const T* src = row + (size_t)(is_q ? kh * G + h : nh + kh) * HD;
        float v[HD / 32], o[HD / 32];
#pragma unroll
        for (int j = 0; j < HD / 32; ++j) v[j] = __bfloat162float(__ldcg(src + wl + 32 * j));
        norm_rope_vals<T, HD / 32>(v, is_q ? p.q_w : p.k_w, p.inv_freq, pos, p.qk_eps, wl, o);
        if (is_q) {
#pragma unroll
          for (int j = 0; j < HD / 32; ++j) qs[hi][h][wl + 32 * j] = (T)o[j];
        } else {
          const T* vsrc = row + (size_t)(nh + nkv + kh) * HD;
          const bool write = p.slots[b] != 0xffffffffu;
          const size_t off = ((size_t)kh * p.num_slots + (write ? p.slots[b] : 0)) * HD;
#pragma unroll
          for (int j = 0; j < HD / 32; ++j) {
            const T kv = (T)o[j];
            const T vv = __ldcg(vsrc + wl + 32 * j);
            knew[hi][wl + 32 * j] = kv;
            vnew[hi][wl + 32 * j] = vv;
            if (write) {
              p.k_cache[off + wl + 32 * j] = kv;
              p.v_cache[off + wl + 32 * j] = vv;
            }
          }
        }
      }
    }
    half_sync(hi);
    float qv[G][PER];
#pragma unroll
    for (int g = 0; g < G; ++g) load8(&qs[hi][g][lane * PER], qv[g]);
    float m[G], l[G], acc[G][PER];
    empty_groups<G>(m, l, acc);
    for (int base = start; base < end; base += GROUPS * LFETCH) {
      if (base != start) fetch(base);
#pragma unroll
      for (int u = 0; u < LFETCH; ++u) {
        const int q = base + grp + GROUPS * u;
        const bool valid = q < end;
        float kv[PER];
        if (!valid) {
#pragma unroll
          for (int i = 0; i < PER; ++i) kv[i] = 0.f;
        } else if (q == newp) {
          load8(&knew[hi][lane * PER], kv);
        } else {
          raw8_to_f32(kr[u], 1.f, kv);
        }
        float sc[G];
        head_scores<G>(qv, kv, sc);
        if (!valid) continue;
        if (q == newp) load8(&vnew[hi][lane * PER], kv);
        else raw8_to_f32(vr[u], 1.f, kv);
        softmax_step<G>(sc, kv, m, l, acc);
      }
    }
    store_groups<G>(m, l, acc, grp, lane, sm[hi], sl[hi], sacc[hi]);
    half_sync(hi);
    for (int idx = tid; idx < G * HD; idx += THREADS) {
      const int g = idx / HD, d = idx % HD;
      float M, L, A;
      merge_groups<G>(sm[hi], sl[hi], sacc[hi], g, d, M, L, A);
      const size_t pi = ((size_t)b * nh + kh * G + g) * p.splits + x.split;
      p.part_acc[pi * HD + d] = A;
      if (d == 0) {
        p.part_ml[pi * 2] = M;
        p.part_ml[pi * 2 + 1] = L;
      }
    }
    half_sync(hi);  // the shared arrays are free for this half's next item
  }
}

// Phase C: attn[b][h] from its partitions (the clustered fused attention's merge: the same
// sums in the same order), a (row, head) per half block.
template <int G>
__device__ void merge_phase(const LayerParams& p, int rows) {
  const int hi = threadIdx.x / THREADS, d = threadIdx.x % THREADS;
  const int nh = p.nkv * G;
  for (int pr = hi * gridDim.x + blockIdx.x; pr < rows * nh; pr += 2 * gridDim.x) {
    const int b = pr / nh;
    const int ctx = (int)p.ctx_lens[b];
    const int S = layer_splits(ctx, p.splits);
    const int part = decode_part(ctx, S, 16);
    const int used = ctx > 0 ? min(S, (ctx + part - 1) / part) : 0;
    const size_t base = (size_t)pr * p.splits;
    float M = -INFINITY;
    for (int r = 0; r < used; ++r) M = fmaxf(M, __ldcg(&p.part_ml[(base + r) * 2]));
    float L = 0.f, A = 0.f;
    if (M != -INFINITY) {
      for (int r = 0; r < used; ++r) {
        const float w = __expf(__ldcg(&p.part_ml[(base + r) * 2]) - M);
        L += __ldcg(&p.part_ml[(base + r) * 2 + 1]) * w;
        A += __ldcg(&p.part_acc[(base + r) * HD + d]) * w;
      }
    }
    p.attn[(size_t)pr * HD + d] = __float2bfloat16(L > 0.f ? A / L : 0.f);
  }
}

template <int T, int G, bool DEFER>
__device__ void decode_layer(const LayerParams& p) {
  extern __shared__ __align__(16) __nv_bfloat16 x_s[];
  const int lane = threadIdx.x % 32;
  const int NW = gridDim.x * WARPS, gw = blockIdx.x * WARPS + threadIdx.x / 32;
  const int H = p.hidden, I = p.inter, nh = p.nkv * G, nhd = nh * HD;
  const int nq = (nh + 2 * p.nkv) * HD;
  const int W = p.width != nullptr ? (int)*p.width : p.W;
  // Before the wait: weights and K/V pages into L2, qkv's first batch into registers.
  prefetch_weights(p, nq, nhd);
  prefetch_kv(p, W, threadIdx.x / THREADS);
  uint4 w1[1][BATCH];
  uint4 w2[2][BATCH];
  Stream s1 = stream_start<1>(p.w_qkv, nq, H, gw, NW, lane, w1);
  pdl_wait();
  unsigned long long base = 0;
  if (threadIdx.x == 0) base = bar_base(p.barrier);
  const int stop = p.mode & 7;
  const bool work = (p.mode & 8) == 0, nap = (p.mode & 16) != 0;
  float inv[T];
  // A
  if (work) {
    layer_norm<T, DEFER>(p.res, p.delta, p.res1, p.in_norm, p.eps, p.add, H, x_s, inv);
    stream_rows<T, 1, DEFER>(p.w_qkv, PlainX{x_s, H}, p.qkv, nq, H, gw, NW, lane, inv, w1, s1);
  }
  grid_sync(p.barrier, base + gridDim.x, nap);
  if (stop == 1) return stop_after(p.barrier, 1);
  // B
  if (work) attention_phase<G>(p, W, T * p.nkv * p.splits);
  grid_sync(p.barrier, base + 2ull * gridDim.x, nap);
  if (stop == 2) return stop_after(p.barrier, 2);
  // C
  if (work) merge_phase<G>(p, T);
  s1 = stream_start<1>(p.w_o, H, nhd, gw, NW, lane, w1);
  grid_sync(p.barrier, base + 3ull * gridDim.x, nap);
  if (stop == 3) return stop_after(p.barrier, 3);
  // D
  if (work) {
    stage(p.attn, T * nhd, x_s);
    stream_rows<T, 1, false>(p.w_o, PlainX{x_s, nhd}, p.o, H, nhd, gw, NW, lane, inv, w1, s1);
  }
  Stream s2 = stream_start<2>(p.w_gu, I, H, gw, NW, lane, w2);
  grid_sync(p.barrier, base + 4ull * gridDim.x, nap);
  if (stop == 4) return stop_after(p.barrier, 4);
  // E
  if (work) {
    layer_norm<T, DEFER>(p.res_mid, p.o, p.res2, p.post_norm, p.eps, 1, H, x_s, inv);
    stream_rows<T, 2, DEFER>(p.w_gu, PlainX{x_s, H}, p.act, I, H, gw, NW, lane, inv, w2, s2);
  }
  s1 = stream_start<1>(p.w_down, H, I, gw, NW, lane, w1);
  grid_sync(p.barrier, base + 5ull * gridDim.x, nap);
  if (stop == 5) return;
  // F
  pdl_trigger();
  if (work) {
    stage(p.act, T * I, x_s);
    stream_rows<T, 1, false>(p.w_down, PlainX{x_s, I}, p.down, H, I, gw, NW, lane, inv, w1, s1);
  }
}

}  // namespace

#define PS_DECODE_LAYER(T, G, D, NAME)                                                         \
  extern "C" __global__ void __launch_bounds__(LT, 1)                                          \
      decode_layer_t##T##_g##G##_##NAME(const LayerParams p) {                                 \
    decode_layer<T, G, D>(p);                                                                  \
  }
#define PS_DECODE_LAYER_T(T)                                                                   \
  PS_DECODE_LAYER(T, 1, false, norm)                                                           \
  PS_DECODE_LAYER(T, 2, false, norm)                                                           \
  PS_DECODE_LAYER(T, 4, false, norm)                                                           \
  PS_DECODE_LAYER(T, 1, true, dnorm)                                                           \
  PS_DECODE_LAYER(T, 2, true, dnorm)                                                           \
  PS_DECODE_LAYER(T, 4, true, dnorm)
PS_DECODE_LAYER_T(1)
PS_DECODE_LAYER_T(2)
