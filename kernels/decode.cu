// Paged attention for decode steps (one query token per sequence), flash-decoding style.
//
// q [B, nh, hd] (already scaled by 1/sqrt(hd)); the K/V caches are head-major
// [nkv, num_slots, hd]; sequence b's token p sits in slot
// block_tables[b * W + p / block_size] * block_size + p % block_size.
//
// Grid (B, nkv, splits): a block takes one sequence, one KV head and one partition of PART
// context tokens, and serves every query head of that KV head's group (GQA: each K/V row is
// read once for the G query heads). Inside, each half-warp takes one token at a time (a lane
// holds 8 of the 128 dims, a 16-byte load), with an online softmax in f32 per query head;
// the 8 half-warps are merged through shared memory. With one partition the block writes the
// output; otherwise it writes its max, sum and unnormalized accumulator and a second kernel
// merges the partitions. The number of partitions is the grid's, not the context lengths';
// a graph captures a fixed number and each sequence's partitions grow to cover its context,
// those past its end writing an empty partial. The table row width comes as an argument, or,
// for a captured graph, from device memory (`width`), so one graph serves any width.
// Pure decode steps of few sequences use decode_fused instead (fused_decode.cu): q/k norm, RoPE, the KV
// write, this attention and the merge in one launch.

#include "attention.cuh"

namespace {

// KT: the caches' element type (T, or fp8 with the scales ks / vs; K's is folded into q).
template <typename T, typename KT, int G>
__device__ void paged_decode(const T* __restrict__ q, const KT* __restrict__ k_cache,
                             const KT* __restrict__ v_cache,
                             const uint32_t* __restrict__ block_tables,
                             const uint32_t* __restrict__ ctx_lens, T* __restrict__ out,
                             float* __restrict__ part_acc, float* __restrict__ part_ml, int W,
                             const uint32_t* __restrict__ width, int block_size,
                             long long num_slots, int nkv, int part_min, float ks, float vs) {
  const int b = blockIdx.x, kh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int nh = nkv * G;
  const int ctx = (int)ctx_lens[b];
  if (width != nullptr) W = (int)*width;
  // A partition is part_min tokens, or longer when the fixed number of partitions (a captured
  // graph's grid) would not cover the context otherwise.
  const int part = decode_part(ctx, splits, part_min);
  const int start = split * part;
  // A partition past the context: the reduce reads none of it (one partition still writes
  // the output, zeros for an empty context).
  if (splits > 1 && start >= ctx) return;
  const int end = min(ctx, start + part);
  const int grp = threadIdx.x / LANES, lane = threadIdx.x % LANES;

  float qv[G][PER];
#pragma unroll
  for (int g = 0; g < G; ++g) load8(q + ((size_t)b * nh + kh * G + g) * HD + lane * PER, qv[g]);
  if constexpr (IsFp8<KT>::value) {
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int i = 0; i < PER; ++i) qv[g][i] *= ks;
  }

  float m[G], l[G], acc[G][PER];
  empty_groups<G>(m, l, acc);
  const uint32_t* table = block_tables + (size_t)b * W;
  const size_t head_base = (size_t)kh * num_slots;
  // Half-warp grp takes tokens start + grp + GROUPS * k in order (the fused kernel's order:
  // the same sums), FETCH of them a round with every K/V load of the round in flight at once.
  // Every half-warp runs the same rounds (the shuffles need the whole warp); a token past the
  // end computes nothing and leaves the state as it was.
  // (fp8 with 8 tokens a round measured 6-7% slower than 4 at batch 256-512 on the H200.)
  constexpr int FETCH = G >= 8 ? 2 : 4;
  using Raw = typename KvRaw<KT>::type;
  for (int base = start; base < end; base += GROUPS * FETCH) {
    Raw kr[FETCH], vr[FETCH];
#pragma unroll
    for (int u = 0; u < FETCH; ++u) {
      const int p = base + grp + GROUPS * u;
      if (p < end) {
        const size_t slot = (size_t)table[p / block_size] * block_size + p % block_size;
        const size_t off = (head_base + slot) * HD + lane * PER;
        kr[u] = *reinterpret_cast<const Raw*>(k_cache + off);
        vr[u] = *reinterpret_cast<const Raw*>(v_cache + off);
      }
    }
#pragma unroll
    for (int u = 0; u < FETCH; ++u) {
      const int p = base + grp + GROUPS * u;
      const bool valid = p < end;
      float kv[PER];
      if (valid) {
        raw8_to_f32(kr[u], 1.f, kv);
      } else {
#pragma unroll
        for (int i = 0; i < PER; ++i) kv[i] = 0.f;
      }
      float s[G];
      head_scores<G>(qv, kv, s);
      if (!valid) continue;
      raw8_to_f32(vr[u], vs, kv);
      softmax_step<G>(s, kv, m, l, acc);
    }
  }

  // Merge the half-warps: [GROUPS][G] max/sum, [GROUPS][G][HD] accumulators.
  __shared__ float sm[GROUPS][G], sl[GROUPS][G];
  __shared__ float sacc[GROUPS][G][HD];
  store_groups<G>(m, l, acc, grp, lane, sm, sl, sacc);
  __syncthreads();
  // Thread t merges dim t % HD of head t / HD (G * HD outputs, THREADS threads).
  for (int idx = threadIdx.x; idx < G * HD; idx += THREADS) {
    int g = idx / HD, d = idx % HD;
    float M, L, A;
    merge_groups<G>(sm, sl, sacc, g, d, M, L, A);
    int h = kh * G + g;
    if (splits == 1) {
      T* o = out + ((size_t)b * nh + h) * HD + d;
      float v = L > 0.f ? A / L : 0.f;
      *o = (T)v;
    } else {
      size_t pi = ((size_t)b * nh + h) * splits + split;
      part_acc[pi * HD + d] = A;
      if (d == 0) { part_ml[pi * 2] = M; part_ml[pi * 2 + 1] = L; }
    }
  }
}

// Merges the partitions of paged_decode that hold context: grid (B, nh), HD threads.
template <typename T>
__device__ void paged_decode_reduce(const float* __restrict__ part_acc,
                                    const float* __restrict__ part_ml,
                                    const uint32_t* __restrict__ ctx_lens, T* __restrict__ out,
                                    int splits, int part_min) {
  const int b = blockIdx.x, h = blockIdx.y, nh = gridDim.y, d = threadIdx.x;
  const int ctx = (int)ctx_lens[b];
  const int part = decode_part(ctx, splits, part_min);
  const int used = ctx > 0 ? min(splits, (ctx + part - 1) / part) : 0;
  size_t base = ((size_t)b * nh + h) * splits;
  float M = -INFINITY;
#pragma unroll 8
  for (int s = 0; s < used; ++s) M = fmaxf(M, part_ml[(base + s) * 2]);
  float L = 0.f, A = 0.f;
  if (M != -INFINITY) {
#pragma unroll 8
    for (int s = 0; s < used; ++s) {
      float w = __expf(part_ml[(base + s) * 2] - M);
      L += part_ml[(base + s) * 2 + 1] * w;
      A += part_acc[(base + s) * HD + d] * w;
    }
  }
  out[((size_t)b * nh + h) * HD + d] = (T)(L > 0.f ? A / L : 0.f);
}

}  // namespace

#define PS_DECODE_KV(T, KT, NAME, G)                                                             \
  extern "C" __global__ void __launch_bounds__(THREADS)                                         \
      paged_decode_g##G##_##NAME(const DecodeParams p) {                                        \
    pdl_entry();                                                                                \
    paged_decode<T, KT, G>((const T*)p.q, (const KT*)p.k_cache, (const KT*)p.v_cache,           \
                           p.block_tables, p.ctx_lens, (T*)p.out, p.part_acc, p.part_ml, p.W,   \
                           p.width, p.block_size, p.num_slots, p.nkv, p.part, p.k_scale,        \
                           p.v_scale);                                                          \
  }
#define PS_DECODE(T, NAME, G) PS_DECODE_KV(T, T, NAME, G)

#define PS_DECODE_ALL(T, NAME)                                                                   \
  PS_DECODE(T, NAME, 1)                                                                          \
  PS_DECODE(T, NAME, 2)                                                                          \
  PS_DECODE(T, NAME, 4)                                                                          \
  PS_DECODE(T, NAME, 8)                                                                          \
  extern "C" __global__ void paged_decode_reduce_##NAME(                                        \
      const float* part_acc, const float* part_ml, const uint32_t* ctx_lens, T* out, int splits, \
      int part_min) { pdl_entry();                                                                           \
    paged_decode_reduce<T>(part_acc, part_ml, ctx_lens, out, splits, part_min);                 \
  }

PS_DECODE_ALL(__nv_bfloat16, bf16)
PS_DECODE_ALL(float, f32)
// bf16 compute over an fp8 cache (the reduce is bf16's).
PS_DECODE_KV(__nv_bfloat16, fp8, fp8, 1)
PS_DECODE_KV(__nv_bfloat16, fp8, fp8, 2)
PS_DECODE_KV(__nv_bfloat16, fp8, fp8, 4)
PS_DECODE_KV(__nv_bfloat16, fp8, fp8, 8)
