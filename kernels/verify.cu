// Verify steps of speculative decoding (launchers: src/engine/cuda/verify.rs): the attention
// that serves a sequence's last token and its drafts from one K/V load (paged_verify_g*, with
// its reduce), and the acceptance of the drafts against the tokens drawn (spec_accept).

#include "attention.cuh"

namespace {

// Verify steps of speculative decoding: a sequence's last token and its drafts are rows
// b..b+n-1 of the step, at consecutive positions (row i's context is the first row's plus i,
// causal within the draft). runs[b] = (j << 16) | n says row b is position j of such a run
// of n rows (a plain decode row: 0 << 16 | 1). The rows are served in chunks of R: the block
// of a chunk's first row loads each K/V row of its partition once for the chunk's R x G
// query vectors (the other rows' blocks exit at once), and a row takes a token only when it
// lies in that row's context. Partitions are cut by the chunk's longest context, so the
// reduce (paged_verify_reduce) finds the chunk as the kernel did.
__device__ __forceinline__ void verify_chunk(const uint32_t* __restrict__ runs, int b, int R,
                                             int& lead, int& n) {
  const uint32_t r = runs[b];
  const int j = (int)(r >> 16), rows = max(1, (int)(r & 0xffffu));
  const int off = j % R;
  lead = b - off;
  n = max(1, min(R, rows - (j - off)));
}

template <typename T, typename KT, int G, int R>
__device__ void paged_verify(const DecodeParams& p, const uint32_t* __restrict__ runs) {
  const int b = blockIdx.x, kh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  int lead, n;
  verify_chunk(runs, b, R, lead, n);
  if (lead != b) return;
  constexpr int QV = R * G;
  const int nh = p.nkv * G;
  const uint32_t* __restrict__ ctx_lens = p.ctx_lens;
  int crow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) crow[r] = r < n ? (int)ctx_lens[b + r] : 0;
  int ctx = 0;
#pragma unroll
  for (int r = 0; r < R; ++r) ctx = max(ctx, crow[r]);
  const int W = p.width != nullptr ? (int)*p.width : p.W;
  const int part = decode_part(ctx, splits, p.part);
  const int start = split * part;
  if (splits > 1 && start >= ctx) return;
  const int end = min(ctx, start + part);
  const int grp = threadIdx.x / LANES, lane = threadIdx.x % LANES;
  const T* __restrict__ q = (const T*)p.q;
  const KT* __restrict__ k_cache = (const KT*)p.k_cache;
  const KT* __restrict__ v_cache = (const KT*)p.v_cache;

  float qv[QV][PER];
#pragma unroll
  for (int v = 0; v < QV; ++v) {
    const int r = v / G, g = v % G;
    if (r < n) {
      load8(q + ((size_t)(b + r) * nh + kh * G + g) * HD + lane * PER, qv[v]);
      if constexpr (IsFp8<KT>::value) {
#pragma unroll
        for (int i = 0; i < PER; ++i) qv[v][i] *= p.k_scale;
      }
    } else {
#pragma unroll
      for (int i = 0; i < PER; ++i) qv[v][i] = 0.f;
    }
  }

  float m[QV], l[QV], acc[QV][PER];
  empty_groups<QV>(m, l, acc);
  // The chunk's last row has the longest table (the others' are its prefixes).
  int last = 0;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (crow[r] == ctx && r < n) last = r;
  const uint32_t* table = p.block_tables + (size_t)(b + last) * W;
  const size_t head_base = (size_t)kh * p.num_slots;
  const int block_size = p.block_size;
  // Every K/V load of a half-warp's tokens in flight at once where the partition allows
  // (the launcher cuts partitions as short as the grid allows: a verify block's rounds of
  // dependent loads, not its bytes, are its time).
  constexpr int FETCH = 4;
  using Raw = typename KvRaw<KT>::type;
  for (int base = start; base < end; base += GROUPS * FETCH) {
    Raw kr[FETCH], vr[FETCH];
#pragma unroll
    for (int u = 0; u < FETCH; ++u) {
      const int t = base + grp + GROUPS * u;
      if (t < end) {
        const size_t slot = (size_t)table[t / block_size] * block_size + t % block_size;
        const size_t off = (head_base + slot) * HD + lane * PER;
        kr[u] = *reinterpret_cast<const Raw*>(k_cache + off);
        vr[u] = *reinterpret_cast<const Raw*>(v_cache + off);
      }
    }
#pragma unroll
    for (int u = 0; u < FETCH; ++u) {
      const int t = base + grp + GROUPS * u;
      const bool valid = t < end;
      float kv[PER];
      if (valid) {
        raw8_to_f32(kr[u], 1.f, kv);
      } else {
#pragma unroll
        for (int i = 0; i < PER; ++i) kv[i] = 0.f;
      }
      float s[QV];
      head_scores<QV>(qv, kv, s);
      if (!valid) continue;
      raw8_to_f32(vr[u], p.v_scale, kv);
#pragma unroll
      for (int v = 0; v < QV; ++v) {
        if (t >= crow[v / G]) continue;  // past this row's position: causal within the draft
        const float mn = fmaxf(m[v], s[v]);
        const float scale = __expf(m[v] - mn);
        const float e = __expf(s[v] - mn);
        l[v] = l[v] * scale + e;
#pragma unroll
        for (int i = 0; i < PER; ++i) acc[v][i] = acc[v][i] * scale + e * kv[i];
        m[v] = mn;
      }
    }
  }

  __shared__ float sm[GROUPS][QV], sl[GROUPS][QV];
  __shared__ float sacc[GROUPS][QV][HD];
  store_groups<QV>(m, l, acc, grp, lane, sm, sl, sacc);
  __syncthreads();
  for (int idx = threadIdx.x; idx < QV * HD; idx += THREADS) {
    const int v = idx / HD, d = idx % HD, r = v / G, g = v % G;
    if (r >= n) continue;
    float M, L, A;
    merge_groups<QV>(sm, sl, sacc, v, d, M, L, A);
    const int row = b + r, h = kh * G + g;
    if (splits == 1) {
      ((T*)p.out)[((size_t)row * nh + h) * HD + d] = (T)(L > 0.f ? A / L : 0.f);
    } else {
      const size_t pi = ((size_t)row * nh + h) * splits + split;
      p.part_acc[pi * HD + d] = A;
      if (d == 0) { p.part_ml[pi * 2] = M; p.part_ml[pi * 2 + 1] = L; }
    }
  }
}

// paged_decode_reduce for paged_verify: a row's partitions are those of its chunk's longest
// context (R rows a chunk, as the kernel had them).
template <typename T>
__device__ void paged_verify_reduce(const float* __restrict__ part_acc,
                                    const float* __restrict__ part_ml,
                                    const uint32_t* __restrict__ ctx_lens,
                                    const uint32_t* __restrict__ runs, T* __restrict__ out,
                                    int splits, int part_min, int R) {
  const int b = blockIdx.x, h = blockIdx.y, nh = gridDim.y, d = threadIdx.x;
  int lead, n;
  verify_chunk(runs, b, R, lead, n);
  int ctx = 0;
  for (int r = 0; r < n; ++r) ctx = max(ctx, (int)ctx_lens[lead + r]);
  const int part = decode_part(ctx, splits, part_min);
  const int used = ctx > 0 ? min(splits, (ctx + part - 1) / part) : 0;
  const size_t base = ((size_t)b * nh + h) * splits;
  float M = -INFINITY;
  for (int s = 0; s < used; ++s) M = fmaxf(M, part_ml[(base + s) * 2]);
  float L = 0.f, A = 0.f;
  if (M != -INFINITY) {
    for (int s = 0; s < used; ++s) {
      const float w = __expf(part_ml[(base + s) * 2] - M);
      L += part_ml[(base + s) * 2 + 1] * w;
      A += part_acc[(base + s) * HD + d] * w;
    }
  }
  out[((size_t)b * nh + h) * HD + d] = (T)(L > 0.f ? A / L : 0.f);
}

}  // namespace

// Verify attention, GQA group G in chunks of 8 / G rows (8 query vectors a block).
#define PS_VERIFY_KV(T, KT, NAME, G)                                                             \
  extern "C" __global__ void __launch_bounds__(THREADS)                                         \
      paged_verify_g##G##_##NAME(const DecodeParams p, const uint32_t* runs) {                  \
    pdl_entry();                                                                                \
    paged_verify<T, KT, G, 8 / G>(p, runs);                                                     \
  }
#define PS_VERIFY_ALL(T, KT, NAME) \
  PS_VERIFY_KV(T, KT, NAME, 1)     \
  PS_VERIFY_KV(T, KT, NAME, 2)     \
  PS_VERIFY_KV(T, KT, NAME, 4)

PS_VERIFY_ALL(__nv_bfloat16, __nv_bfloat16, bf16)
PS_VERIFY_ALL(float, float, f32)
PS_VERIFY_ALL(__nv_bfloat16, fp8, fp8)

#define PS_VERIFY_REDUCE(T, NAME)                                                               \
  extern "C" __global__ void paged_verify_reduce_##NAME(                                       \
      const float* part_acc, const float* part_ml, const uint32_t* ctx_lens,                   \
      const uint32_t* runs, T* out, int splits, int part_min, int R) {                         \
    pdl_entry();                                                                                \
    paged_verify_reduce<T>(part_acc, part_ml, ctx_lens, runs, out, splits, part_min, R);       \
  }
PS_VERIFY_REDUCE(__nv_bfloat16, bf16)
PS_VERIFY_REDUCE(float, f32)

// The drafts each sequence keeps: ids [rows] are the tokens drawn from the verify step's rows,
// drafts [rows] what each row's draw must equal for the next draft to stand (0xffffffff
// after a sequence's last draft), starts [seqs + 1] where each sequence's rows begin. out
// [rows + seqs]: the ids, then per sequence the drafts kept (those that equal the draw of the
// row before them, up to the first that does not). One read of `out` gives the host both.
extern "C" __global__ void spec_accept(const uint32_t* __restrict__ ids,
                                       const uint32_t* __restrict__ drafts,
                                       const uint32_t* __restrict__ starts, int seqs, int rows,
                                       uint32_t* __restrict__ out) {
  pdl_entry();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) out[r] = ids[r];
  for (int s = threadIdx.x; s < seqs; s += blockDim.x) {
    const uint32_t a = starts[s], b = starts[s + 1];
    uint32_t k = 0;
    while (a + k + 1 < b && ids[a + k] == drafts[a + k]) ++k;
    out[rows + s] = k;
  }
}
