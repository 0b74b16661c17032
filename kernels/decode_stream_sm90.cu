// The streamed decode step (LaunchOptions::layer_stream): every dense Qwen3 layer of a 1-row
// pure decode step (bf16 weights and KV cache, head_dim 128) in one launch of one block per
// SM, 8 compute warps and a copy warp, the weights streamed into shared memory by the copy
// engine (TMA bulk copies, sm_90) ahead of the phase that reads them. A layer:
//
//  A. add + RMSNorm into shared memory, the qkv matmul;              grid barrier
//  B. attention: each (KV head, partition) item, on half a block, does q/k norm + RoPE, writes
//     the new K/V to the cache, runs the online softmax over its tokens and writes its
//     partial; the last partition of a head to finish merges the head's partials (a counter
//     a head) and counts the head as done;
//  D. (every head of the layer done) the o matmul;                    grid barrier
//  E. add + RMSNorm and the gate|up matmul with SiLU * up;            grid barrier
//  F. the down matmul;                                                grid barrier (not after
//     the last layer: the kernel's end).
//
// The weights: each compute warp owns a ring of `ns` slots of 2 KB in dynamic shared memory
// and the rows it computes in every phase of every layer (rows gw, gw + NW, ... of each
// matmul, NW the compute warps of the grid), split into pieces of 1,024 inputs. Lane w of
// the copy warp keeps warp w's ring full: a piece is copied (cp.async.bulk; a full and an
// empty mbarrier a slot) as soon as its slot is summed, across phases and layers, so the next
// weights land while the warp waits at a barrier or runs the attention; the copy warp never
// waits on the kernel before (PDL) and never fences. Each row's sum is the skinny matmuls'
// (`gemv.cuh` dot_rows: lane l sums chunks l, l + 32, ... in order, then the warp's
// butterfly), so the matmuls give the five launches' bits on the same inputs. The residual
// stream starts in res0 and ends in res1 with the last down still to add (the final norm).
//
// Data written by one block and read by another in the same launch is read through L2
// (ld.global.cg, or ld.acquire for the counters), never L1.

#include "gemv.cuh"
#include "attention.cuh"

// One layer's weights and caches.
struct LayerPtrs {
  const __nv_bfloat16* w_qkv;
  const __nv_bfloat16* w_o;
  const __nv_bfloat16* w_gu;    // gate | up, [2I, H]
  const __nv_bfloat16* w_down;  // [H, I]
  const __nv_bfloat16* in_norm;
  const __nv_bfloat16* post_norm;
  const __nv_bfloat16* q_w;  // q norm weight, pre-scaled by 1/sqrt(128)
  const __nv_bfloat16* k_w;
  __nv_bfloat16* k_cache;
  __nv_bfloat16* v_cache;
};

constexpr int STACK_MAX_LAYERS = 40;

struct StreamParams {
  LayerPtrs layers[STACK_MAX_LAYERS];
  const float* inv_freq;
  __nv_bfloat16* res0;  // the residual stream in (the embedding's output)
  __nv_bfloat16* res1;  // the other residual buffer (the stream ends in it)
  __nv_bfloat16* qkv;
  __nv_bfloat16* attn;
  __nv_bfloat16* o;
  __nv_bfloat16* act;
  __nv_bfloat16* down;  // the last layer's down: the delta the final norm adds
  const uint32_t* pos;
  const uint32_t* slots;
  const uint32_t* block_tables;  // the row's table
  const uint32_t* ctx_lens;
  float* part_acc;  // [nh][splits][128]
  float* part_ml;   // [nh][splits][2]
  unsigned long long* sync;  // [0] grid-barrier arrivals, [1] heads merged (only ever added to)
  unsigned* counters;        // partitions finished, one per KV head (kept zero between uses)
  long long num_slots;
  int nlayers;
  int block_size;
  int nkv;
  int splits;  // partial slots a head in the scratch
  int hidden;
  int inter;
  float eps;
  float qk_eps;
  int ns;    // ring slots a warp
  // Profiling only (0 in the engine): bit 3 skips every phase's work (the barriers alone; the
  // outputs are then wrong); bit 4 prints the phases' times (SM cycles) of blocks 0 and 77;
  // bit 5 copies the weights with L2's default policy instead of evict-first.
  int mode;
};
static_assert(sizeof(LayerPtrs) == 80, "LayerPtrs layout");
static_assert(sizeof(StreamParams) == 3376, "StreamParams layout");
static_assert(offsetof(StreamParams, num_slots) == 3328 && offsetof(StreamParams, eps) == 3360,
              "StreamParams layout");

namespace {

constexpr int ST = WARPS * 32;      // threads a block
constexpr int PIECE = 1024;         // inputs a weight piece (2 KB; 4 chunks a lane)
constexpr int PIECE_BYTES = PIECE * 2;
constexpr int MAX_NS = 10;          // ring slots a warp at most
constexpr int LFETCH = 4;           // tokens per half-warp whose K/V loads are in flight together
constexpr int MIN_SPLITS = 16;      // partitions of a context up to MIN_SPLITS * 128 tokens
constexpr int NORM_REGS = 16;       // inputs of a norm a thread holds (hidden <= 4,096)

__device__ __forceinline__ uint32_t saddr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Barrier of the compute warps (256 threads, id 3): the producer warp never joins one.
__device__ __forceinline__ void csync() { asm volatile("bar.sync 3, %0;" ::"r"(ST) : "memory"); }

// Thread 0 waits until *c >= target, then the block goes on (the writes counted before it
// visible after it).
__device__ __forceinline__ void wait_count(const unsigned long long* c, unsigned long long target) {
  if (threadIdx.x == 0)
    while (ld_acquire(c) < target) {
    }
  csync();
}

// Every block of the grid has arrived here: this block's writes before it are visible to
// every block after it.
__device__ __forceinline__ void grid_sync(unsigned long long* bar, unsigned long long target) {
  csync();
  if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(bar) : "memory");
  wait_count(bar, target);
}

// Barrier of one half of the block (128 threads; ids 1 and 2, 0 is __syncthreads').
__device__ __forceinline__ void half_sync(int hi) {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + hi), "r"(THREADS) : "memory");
}

// Partitions of a context of ctx tokens (at most smax).
__device__ __forceinline__ int layer_splits(int ctx, int smax) {
  return min(smax, max(MIN_SPLITS, (ctx + 127) / 128));
}

// ---- The weight ring ----------------------------------------------------------------------

// One matmul of the layer as the warps see it: rows of K inputs (pairs for NR 2: gate row r
// and up row N + r), the warp's rows gw, gw + NW, ...
struct Mat {
  const __nv_bfloat16* w;
  int N, K, nr;
};

// The layer's four matmuls as the warps see them.
__device__ __forceinline__ void layer_mats(const LayerPtrs& L, int nq, int H, int nhd, int I,
                                           Mat (&mats)[4]) {
  mats[0] = {L.w_qkv, nq, H, 1};
  mats[1] = {L.w_o, H, nhd, 1};
  mats[2] = {L.w_gu, I, H, 2};
  mats[3] = {L.w_down, H, I, 1};
}

// A compute warp's ring: its slots, their full (copy landed) and empty (piece summed)
// mbarriers, and the pieces it has summed.
struct Ring {
  __nv_bfloat16* slots;  // ns * PIECE bf16
  uint64_t* full;        // ns mbarriers
  uint64_t* empty;       // ns mbarriers
  int ns, gw, NW, lane;
  int used;              // pieces summed so far
};

__device__ __forceinline__ int warp_rows(const Mat& a, int gw, int NW) {
  return gw < a.N ? (a.N - 1 - gw) / NW + 1 : 0;
}

__device__ __forceinline__ bool mbar_done(uint64_t* b, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok)
      : "r"(saddr(b)), "r"(parity)
      : "memory");
  return ok != 0;
}

// Whether the mbarrier's phase of this parity has completed, without waiting.
__device__ __forceinline__ bool mbar_test(uint64_t* b, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok)
      : "r"(saddr(b)), "r"(parity)
      : "memory");
  return ok != 0;
}

// A copy lane's place in its compute warp's sequence of pieces: layer li, matmul m, the
// warp's row r of it, piece q of the row (gate and up alternating for pairs).
struct Cursor {
  int li, m, r, q, issued;
};

// The producer: lane w (< 8) of the block's last warp copies compute warp w's pieces, in the
// order that warp sums them, each into its slot once the piece before it there is summed.
// The eight lanes poll without blocking and stay converged (a lane blocked on its own slot
// does not hold the others back). It never waits on the kernel before (weights only) and
// never fences, so the compute warps' barriers and fences do not wait for its copies.
__device__ void produce(const StreamParams& p, int nq, int nhd, __nv_bfloat16* slots,
                        uint64_t* full, uint64_t* empty, int gw, int NW, bool active) {
  const int ns = p.ns;
  // Weights are read once a step: evict them from L2 first, so they do not push out the
  // K/V pages prefetched for the attention or the activations (mode bit 5: the default
  // policy, for measuring).
  uint64_t policy;
  if (p.mode & 32)
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  else
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  Cursor c{0, 0, 0, 0, 0};
  Mat mats[4];
  layer_mats(p.layers[0], nq, p.hidden, nhd, p.inter, mats);
  // Moves the cursor past matmuls (and layers) of which this warp has no rows.
  auto settle = [&]() {
    while (c.li < p.nlayers && warp_rows(mats[c.m], gw, NW) == 0) {
      if (++c.m == 4) {
        c.m = 0;
        if (++c.li < p.nlayers) layer_mats(p.layers[c.li], nq, p.hidden, nhd, p.inter, mats);
      }
    }
  };
  if (active) settle();
  bool more = active && c.li < p.nlayers;
  while (__any_sync(0xffu, more)) {
    if (!more) continue;
    const int s = c.issued % ns;
    if (c.issued >= ns && !mbar_test(empty + s, (uint32_t)(c.issued / ns - 1) & 1u)) continue;
    const Mat& a = mats[c.m];
    const int row = gw + c.r * NW + (c.q % a.nr) * a.N;
    const __nv_bfloat16* src = a.w + (size_t)row * a.K + (size_t)(c.q / a.nr) * PIECE;
    const uint32_t bar = saddr(full + s);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                 "r"(PIECE_BYTES)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1], %2, [%3], %4;" ::"r"(saddr(slots + (size_t)s * PIECE)),
        "l"(src), "r"(PIECE_BYTES), "r"(bar), "l"(policy)
        : "memory");
    ++c.issued;
    if (++c.q == a.nr * (a.K / PIECE)) {
      c.q = 0;
      if (++c.r == warp_rows(a, gw, NW)) {
        c.r = 0;
        if (++c.m == 4) {
          c.m = 0;
          if (++c.li < p.nlayers) layer_mats(p.layers[c.li], nq, p.hidden, nhd, p.inter, mats);
        }
        settle();
      }
    }
    more = c.li < p.nlayers;
  }
}

// The next piece in order, once it has landed.
__device__ __forceinline__ const __nv_bfloat16* acquire(const Ring& g) {
  const int s = g.used % g.ns;
  while (!mbar_done(g.full + s, (uint32_t)(g.used / g.ns) & 1u)) {
  }
  return g.slots + (size_t)s * PIECE;
}

// The piece is summed (every lane's reads done): its slot is free for the producer.
__device__ __forceinline__ void release(Ring& g) {
  __syncwarp();
  if (g.lane == 0)
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(g.empty + g.used % g.ns))
                 : "memory");
  ++g.used;
}

// This warp's rows of matmul `mi` (NR 1 or a SiLU pair), x in shared memory (K inputs),
// scaled by inv when the norm was deferred: the sums of gemv.cuh's dot_rows in its order.
template <int NR>
__device__ long long ring_rows(Ring& g, const Mat (&mats)[4], int mi, const __nv_bfloat16* x_s,
                               float inv, bool defer, __nv_bfloat16* out) {
  long long waited = 0;
  const Mat& a = mats[mi];
  const int R = warp_rows(a, g.gw, g.NW), P = a.K / PIECE;
  for (int r = 0; r < R; ++r) {
    float acc[NR];
#pragma unroll
    for (int k = 0; k < NR; ++k) acc[k] = 0.f;
    for (int pc = 0; pc < P; ++pc) {
#pragma unroll
      for (int k = 0; k < NR; ++k) {
        const long long t0 = clock64();
        const __nv_bfloat16* w = acquire(g);
        waited += clock64() - t0;
#pragma unroll
        for (int i = 0; i < PIECE / 256; ++i) {
          const int c = g.lane + 32 * i;
          float wf[8], xf[8];
          bf16x8_to_f32(reinterpret_cast<const uint4*>(w)[c], wf);
          bf16x8_to_f32(reinterpret_cast<const uint4*>(x_s)[pc * (PIECE / 8) + c], xf);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[k] = fmaf(wf[j], xf[j], acc[k]);
        }
        release(g);
      }
    }
#pragma unroll
    for (int k = 0; k < NR; ++k) {
      acc[k] = warp_sum(acc[k]);
      if (defer) acc[k] *= inv;
    }
    if (g.lane == 0) {
      float v = acc[0];
      if (NR == 2) v = v / (1.f + __expf(-v)) * acc[NR - 1];
      out[g.gw + r * g.NW] = __float2bfloat16(v);
    }
  }
  return waited;
}

// ---- Norms and staging --------------------------------------------------------------------

// gemv.cuh's norm_rows (DEFER false) / norm_rows_deferred (true) for one row, the rows read
// through L2 with every load of a thread in flight at once, the norm weights from shared
// memory (w_s): the same arithmetic. Returns the deferred scale (1 without DEFER).
template <bool DEFER>
__device__ float stream_norm(const __nv_bfloat16* res, const __nv_bfloat16* delta,
                             __nv_bfloat16* res_out, const __nv_bfloat16* w_s, float eps,
                             int add, int K, __nv_bfloat16* x_s) {
  __nv_bfloat16 rv[NORM_REGS], dv[NORM_REGS];
#pragma unroll
  for (int e = 0; e < NORM_REGS; ++e) {
    const int k = threadIdx.x + e * ST;
    rv[e] = k < K ? __ldcg(res + k) : __float2bfloat16(0.f);
    dv[e] = k < K && add ? __ldcg(delta + k) : __float2bfloat16(0.f);
  }
  float part = 0.f;
#pragma unroll
  for (int e = 0; e < NORM_REGS; ++e) {
    const int k = threadIdx.x + e * ST;
    if (k >= K) break;
    const float wk = DEFER ? __bfloat162float(w_s[k]) : 0.f;
    float v = __bfloat162float(rv[e]);
    if (add) {
      const __nv_bfloat16 s = __float2bfloat16(v + __bfloat162float(dv[e]));
      if (DEFER && blockIdx.x == 0) res_out[k] = s;
      v = __bfloat162float(s);
    }
    x_s[k] = __float2bfloat16(DEFER ? v * wk : v);
    part += v * v;
  }
  // gemv.cuh's block_inv_rms on the compute warps' barrier: the same sums.
  __shared__ float ss[WARPS];
  const float wsum = warp_sum(part);
  if (threadIdx.x % 32 == 0) ss[threadIdx.x / 32] = wsum;
  csync();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < WARPS; ++i) tot += ss[i];
  float inv[1] = {rsqrtf(tot / K + eps)};
  if constexpr (!DEFER) {
    for (int k = threadIdx.x; k < K; k += ST) {
      const __nv_bfloat16 r = x_s[k];
      if (add && blockIdx.x == 0) res_out[k] = r;
      x_s[k] = __float2bfloat16(__bfloat162float(r) * inv[0] * __bfloat162float(w_s[k]));
    }
  }
  csync();
  return DEFER ? inv[0] : 1.f;
}

// n bf16 (a multiple of 8) from global (through L2) into shared memory, then a block barrier.
__device__ __forceinline__ void stage(const __nv_bfloat16* src, int n, __nv_bfloat16* x_s) {
  for (int i = threadIdx.x; i < n / 8; i += ST)
    reinterpret_cast<uint4*>(x_s)[i] = __ldcg(reinterpret_cast<const uint4*>(src) + i);
  csync();
}

// ---- Attention ----------------------------------------------------------------------------

// The tokens of partition `split` of a context of ctx tokens in S partitions.
__device__ __forceinline__ void part_range(int ctx, int S, int split, int& start, int& end) {
  const int part = decode_part(ctx, S, 16);
  start = min(ctx, split * part);
  end = min(ctx, start + part);
}

// Before the wait: the K/V pages of this half's item into L2 (rows of earlier steps, and the
// page the new token goes to: a prefetch only reads).
__device__ __forceinline__ void prefetch_kv(const StreamParams& p, const LayerPtrs& L, int items, int S) {
  const int hi = threadIdx.x / THREADS, it = hi * gridDim.x + blockIdx.x;
  if (it >= items || (threadIdx.x % 32) != 0) return;
  const int ctx = (int)p.ctx_lens[0], kh = it / S;
  int start, end;
  part_range(ctx, S, it % S, start, end);
  if (start >= end) return;
  const int bs = p.block_size, warp = (threadIdx.x % THREADS) / 32;
  for (int pg = start / bs + warp; pg <= (end - 1) / bs; pg += THREADS / 32) {
    const int t0 = max(start, pg * bs), t1 = min(end, (pg + 1) * bs);
    const size_t slot = (size_t)p.block_tables[pg] * bs + (t0 - pg * bs);
    const size_t off = ((size_t)kh * p.num_slots + slot) * HD;
    const unsigned bytes = (unsigned)(t1 - t0) * HD * 2;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(L.k_cache + off), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(L.v_cache + off), "r"(bytes)
                 : "memory");
  }
}

// common.cuh's norm_rope_head over a head read through L2: the same arithmetic.
__device__ __forceinline__ void norm_rope_cg(const __nv_bfloat16* src, const __nv_bfloat16* w,
                                             const float* inv_freq, float pos, float eps,
                                             int lane, float (&o)[HD / 32]) {
  constexpr int P = HD / 32;
  float v[P];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    v[j] = __bfloat162float(__ldcg(src + lane + 32 * j));
    ss += v[j] * v[j];
  }
  const float inv = rsqrtf(warp_sum(ss) / HD + eps);
#pragma unroll
  for (int j = 0; j < P; ++j) v[j] = v[j] * inv * __bfloat162float(w[lane + 32 * j]);
#pragma unroll
  for (int j = 0; j < P / 2; ++j) {
    const int i = lane + 32 * j;
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    const float a = v[j], b = v[j + P / 2];
    o[j] = a * c - b * s;
    o[j + P / 2] = b * c + a * s;
  }
}

// Phase B for one half of the block (128 threads, attention.cuh's geometry): its items'
// partials (fused_decode.cu's CUDA-core loop); the last partition of a head to finish merges
// the head's partials into attn (the clustered fused attention's merge order) and counts it
// in p.sync[1].
template <int G>
__device__ void attention_phase(const StreamParams& p, const LayerPtrs& L, int S) {
  using T = __nv_bfloat16;
  const int hi = threadIdx.x / THREADS, tid = threadIdx.x % THREADS;
  const int grp = tid / LANES, lane = tid % LANES;
  const int nkv = p.nkv, nh = nkv * G, items = nkv * S;
  const int ctx = (int)p.ctx_lens[0], newp = ctx - 1;
  __shared__ __align__(16) T qs[2][G][HD];
  __shared__ __align__(16) T knew[2][HD];
  __shared__ __align__(16) T vnew[2][HD];
  __shared__ float sm[2][GROUPS][G], sl[2][GROUPS][G];
  __shared__ float sacc[2][GROUPS][G][HD];
  __shared__ int last[2];
  for (int it = hi * gridDim.x + blockIdx.x; it < items; it += 2 * gridDim.x) {
    const int kh = it / S, split = it % S;
    int start, end;
    part_range(ctx, S, split, start, end);
    if (start < end) {
      const size_t head_base = (size_t)kh * p.num_slots;
      uint4 kr[LFETCH], vr[LFETCH];
      auto fetch = [&](int base) {
#pragma unroll
        for (int u = 0; u < LFETCH; ++u) {
          const int q = base + grp + GROUPS * u;
          if (q < end && q != newp) {
            const size_t slot =
                (size_t)p.block_tables[q / p.block_size] * p.block_size + q % p.block_size;
            const size_t off = (head_base + slot) * HD + lane * PER;
            kr[u] = __ldcg(reinterpret_cast<const uint4*>(L.k_cache + off));
            vr[u] = __ldcg(reinterpret_cast<const uint4*>(L.v_cache + off));
          }
        }
      };
      fetch(start);
      // q heads into shared memory; the new key and value into the cache and shared memory.
      const bool holds_new = end == ctx;
      {
        const int warp = tid / 32, wl = tid % 32;
        const float pos = (float)p.pos[0];
        for (int h = warp; h < G + (holds_new ? 1 : 0); h += THREADS / 32) {
          const bool is_q = h < G;
          const T* src = p.qkv + (size_t)(is_q ? kh * G + h : nh + kh) * HD;
          float o[HD / 32];
          norm_rope_cg(src, is_q ? L.q_w : L.k_w, p.inv_freq, pos, p.qk_eps, wl, o);
          if (is_q) {
#pragma unroll
            for (int j = 0; j < HD / 32; ++j) qs[hi][h][wl + 32 * j] = (T)o[j];
          } else {
            const T* vsrc = p.qkv + (size_t)(nh + nkv + kh) * HD;
            const bool write = p.slots[0] != 0xffffffffu;
            const size_t off = ((size_t)kh * p.num_slots + (write ? p.slots[0] : 0)) * HD;
#pragma unroll
            for (int j = 0; j < HD / 32; ++j) {
              const T kv = (T)o[j];
              const T vv = __ldcg(vsrc + wl + 32 * j);
              knew[hi][wl + 32 * j] = kv;
              vnew[hi][wl + 32 * j] = vv;
              if (write) {
                L.k_cache[off + wl + 32 * j] = kv;
                L.v_cache[off + wl + 32 * j] = vv;
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
        const size_t pi = (size_t)(kh * G + g) * p.splits + split;
        p.part_acc[pi * HD + d] = A;
        if (d == 0) {
          p.part_ml[pi * 2] = M;
          p.part_ml[pi * 2 + 1] = L;
        }
      }
    }
    // This partition is done (with or without tokens): the last of the head's S merges.
    half_sync(hi);
    if (tid == 0) {
      __threadfence();
      const unsigned before = atomicAdd(&p.counters[kh], 1u);
      last[hi] = before == (unsigned)S - 1;
      if (last[hi]) {
        __threadfence();
        p.counters[kh] = 0;  // kept zero for the next use
      }
    }
    half_sync(hi);
    if (last[hi]) {
      // The head's partials, eight partitions' loads in flight at a time, merged online.
      const int part = decode_part(ctx, S, 16);
      const int used = ctx > 0 ? min(S, (ctx + part - 1) / part) : 0;
      const int d = tid;
      float M[G], L[G], A[G];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        M[g] = -INFINITY;
        L[g] = A[g] = 0.f;
      }
      for (int r0 = 0; r0 < used; r0 += 8) {
        float mr[G][8], lr[G][8], ar[G][8];
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const size_t pi = (size_t)(kh * G + g) * p.splits + r0 + u;
            const bool ok = r0 + u < used;
            mr[g][u] = ok ? __ldcg(&p.part_ml[pi * 2]) : -INFINITY;
            lr[g][u] = ok ? __ldcg(&p.part_ml[pi * 2 + 1]) : 0.f;
            ar[g][u] = ok ? __ldcg(&p.part_acc[pi * HD + d]) : 0.f;
          }
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            if (mr[g][u] == -INFINITY) continue;
            const float mn = fmaxf(M[g], mr[g][u]);
            const float a = __expf(M[g] - mn), b = __expf(mr[g][u] - mn);
            L[g] = L[g] * a + lr[g][u] * b;
            A[g] = A[g] * a + ar[g][u] * b;
            M[g] = mn;
          }
      }
#pragma unroll
      for (int g = 0; g < G; ++g)
        p.attn[(size_t)(kh * G + g) * HD + d] = __float2bfloat16(L[g] > 0.f ? A[g] / L[g] : 0.f);
      half_sync(hi);
      if (tid == 0) asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(p.sync + 1) : "memory");
    }
    half_sync(hi);  // the shared arrays are free for this half's next item
  }
}

// The two norms' weights of a layer into shared memory, as async copies (cp.async; the
// caller waits with cp.async.wait_all before reading them).
__device__ __forceinline__ void stage_norms(const LayerPtrs& L, int H, __nv_bfloat16* nw_s) {
  for (int k = threadIdx.x; k < H / 8; k += ST) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr(nw_s + 8 * k)),
                 "l"(L.in_norm + 8 * k)
                 : "memory");
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr(nw_s + H + 8 * k)),
                 "l"(L.post_norm + 8 * k)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Every layer of the step (see the top of the file): the stream in res0, ending in res1 with
// the last layer's down in `down` (the final norm's delta).
template <int G, bool DEFER>
__device__ void decode_stream(const StreamParams& p) {
  extern __shared__ __align__(128) __nv_bfloat16 dyn[];
  __shared__ __align__(8) uint64_t full[WARPS][MAX_NS], empty[WARPS][MAX_NS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int H = p.hidden, I = p.inter, nh = p.nkv * G, nhd = nh * HD, NL = p.nlayers;
  const int nq = (nh + 2 * p.nkv) * HD;
  const bool work = (p.mode & 8) == 0;
  __nv_bfloat16* x_s = dyn + (size_t)WARPS * p.ns * PIECE;
  if (warp == WARPS) {
    // The copy warp: the rings' mbarriers, then every compute warp's pieces, layer by layer.
    if (lane < WARPS)
      for (int s = 0; s < p.ns; ++s) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[lane][s])) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&empty[lane][s])) : "memory");
      }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    if (lane < WARPS) {
      const int w = lane;
      produce(p, nq, nhd, dyn + (size_t)w * p.ns * PIECE, full[w], empty[w],
              blockIdx.x * WARPS + w, gridDim.x * WARPS, work);
    }
    return;
  }
  Ring g;
  g.ns = p.ns;
  g.slots = dyn + (size_t)warp * p.ns * PIECE;
  g.full = full[warp];
  g.empty = empty[warp];
  g.gw = blockIdx.x * WARPS + warp;
  g.NW = gridDim.x * WARPS;
  g.lane = lane;
  g.used = 0;
  // The norms' weights, double-buffered by layer; layer 0's before the wait (weights only).
  __nv_bfloat16* nw_s = x_s + max(max(H, nhd), I);
  stage_norms(p.layers[0], H, nw_s);
  __syncthreads();  // the mbarriers are initialised (the copy warp's one block-wide barrier)
  pdl_wait();
  const int ctx = (int)p.ctx_lens[0];
  const int S = layer_splits(ctx, p.splits);
  prefetch_kv(p, p.layers[0], p.nkv * S, S);
  const unsigned long long bars = 4ull * NL - 1;  // grid barriers a launch
  __shared__ unsigned long long bases[2];
  if (threadIdx.x == 0) {
    const unsigned long long v = ld_acquire(p.sync), m = ld_acquire(p.sync + 1);
    bases[0] = v - v % (bars * gridDim.x);
    bases[1] = m - m % ((unsigned long long)p.nkv * NL);
  }
  csync();
  unsigned long long bar = bases[0];
  const unsigned long long merged0 = bases[1];
  auto barrier = [&]() {
    bar += gridDim.x;
    grid_sync(p.sync, bar);
  };
  for (int li = 0; li < NL; ++li) {
    const LayerPtrs& L = p.layers[li];
    Mat mats[4];
    layer_mats(L, nq, H, nhd, I, mats);
    // The stream: layer 0 reads res0 and adds nothing; every later layer reads res1 plus the
    // down before it, leaves the first sum in res0 and the second in res1.
    const bool add = li > 0;
    __nv_bfloat16* res = add ? p.res1 : p.res0;
    __nv_bfloat16* nw = nw_s + (li & 1) * 2 * H;
    if (li == NL - 1) pdl_trigger();
    // Profiling (mode bit 4): thread 0 of blocks 0 and 77 times the phases (SM cycles) of
    // steps at positions that are multiples of 32 and prints them.
    long long ts[13], wt[4] = {0, 0, 0, 0};
    const bool trace = (p.mode & 16) && threadIdx.x == 0 && (blockIdx.x == 0 || blockIdx.x == 77 || blockIdx.x == 5) &&
                       p.pos[0] % 32 == 0;
    ts[0] = clock64();
    // A
    asm volatile("cp.async.wait_all;" ::: "memory");
    csync();
    float inv = 1.f;
    if (work) {
      inv = stream_norm<DEFER>(res, p.down, p.res0, nw, p.eps, add, H, x_s);
      ts[1] = clock64();
      wt[0] = ring_rows<1>(g, mats, 0, x_s, inv, DEFER, p.qkv);
    }
    ts[2] = clock64();
    barrier();
    ts[3] = clock64();
    // B, and the next layer's norms and K/V pages on their way
    if (li + 1 < NL) {
      stage_norms(p.layers[li + 1], H, nw_s + ((li + 1) & 1) * 2 * H);
      prefetch_kv(p, p.layers[li + 1], p.nkv * S, S);
    }
    if (work) attention_phase<G>(p, L, S);
    else if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(p.sync + 1, (unsigned long long)p.nkv);
    ts[4] = clock64();
    // D
    wait_count(p.sync + 1, merged0 + (unsigned long long)(li + 1) * p.nkv);
    ts[5] = clock64();
    if (work) {
      stage(p.attn, nhd, x_s);
      ts[6] = clock64();
      wt[1] = ring_rows<1>(g, mats, 1, x_s, 1.f, false, p.o);
    }
    ts[7] = clock64();
    barrier();
    ts[8] = clock64();
    // E
    if (work) {
      inv = stream_norm<DEFER>(p.res0, p.o, p.res1, nw + H, p.eps, 1, H, x_s);
      ts[9] = clock64();
      wt[2] = ring_rows<2>(g, mats, 2, x_s, inv, DEFER, p.act);
    }
    ts[10] = clock64();
    barrier();
    ts[11] = clock64();
    // F
    if (work) {
      stage(p.act, I, x_s);
      wt[3] = ring_rows<1>(g, mats, 3, x_s, 1.f, false, p.down);
    }
    ts[12] = clock64();
    if (li + 1 < NL) barrier();
    if (trace && work)
      printf("stream pos %u L%d b%d | A norm %lld qkv %lld (wait %lld) bar %lld | att %lld merged %lld"
             " | o stage %lld o %lld (wait %lld) bar %lld | E norm %lld gu %lld (wait %lld) bar %lld"
             " | F %lld (wait %lld) bar %lld\n",
             p.pos[0], li, blockIdx.x, ts[1] - ts[0], ts[2] - ts[1], wt[0], ts[3] - ts[2],
             ts[4] - ts[3], ts[5] - ts[4], ts[6] - ts[5], ts[7] - ts[6], wt[1], ts[8] - ts[7],
             ts[9] - ts[8], ts[10] - ts[9], wt[2], ts[11] - ts[10], ts[12] - ts[11], wt[3],
             clock64() - ts[12]);
  }
}

}  // namespace

#define PS_DECODE_STREAM(G, D, NAME)                                                           \
  extern "C" __global__ void __launch_bounds__(ST + 32, 1)                                     \
      decode_stream_g##G##_##NAME(const StreamParams p) {                                      \
    decode_stream<G, D>(p);                                                                    \
  }
PS_DECODE_STREAM(1, false, norm)
PS_DECODE_STREAM(2, false, norm)
PS_DECODE_STREAM(4, false, norm)
PS_DECODE_STREAM(1, true, dnorm)
PS_DECODE_STREAM(2, true, dnorm)
PS_DECODE_STREAM(4, true, dnorm)
