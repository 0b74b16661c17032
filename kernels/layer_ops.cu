// Fused per-layer ops of the Qwen3 forward, for bf16 and f32 activations.
//
//  * add_rmsnorm:   residual += x (optional), out = rmsnorm(residual) * w      (one pass)
//  * silu_mul:      out = silu(gate) * up over a [rows, 2I] gate|up matrix
//  * argmax_rows:   index of the largest value of each row (greedy sampling on the device),
//                   long rows in parts merged by argmax_merge
// Every reduction accumulates in f32. Each kernel reads only device memory it is given and
// needs no host synchronization, so a decode forward built from them can be graph-captured.

#include <cuda_bf16.h>
#include <stdint.h>

#include "common.cuh"

namespace {

// One block per row. If `add`, res_out[row] = res_in[row] + x[row] (rounded to T, as the
// residual stream is stored), else the residual is res_in; then
// out[row] = residual * rsqrt(mean(residual^2) + eps) * w.
template <typename T>
__device__ void add_rmsnorm(const T* __restrict__ x, const T* res_in, T* res_out,
                            const T* __restrict__ w, T* __restrict__ out, int n, float eps,
                            int add) {
  size_t row = blockIdx.x;
  const T* r = res_in + row * n;
  const T* xr = x + row * n;
  T* ro = res_out + row * n;
  T* o = out + row * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = to_f(r[i]);
    if (add) {
      T s = from_f<T>(v + to_f(xr[i]));
      ro[i] = s;
      v = to_f(s);
    }
    ss += v * v;
  }
  float inv = rsqrtf(block_sum(ss) / n + eps);
  const T* rr = add ? ro : r;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    o[i] = from_f<T>(to_f(rr[i]) * inv * to_f(w[i]));
  }
}

template <typename T>
__device__ void silu_mul(const T* __restrict__ gu, T* __restrict__ out, long long rows, int inter) {
  long long n = rows * inter;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    long long r = i / inter;
    int c = (int)(i - r * inter);
    float g = to_f(gu[r * 2 * inter + c]);
    float u = to_f(gu[r * 2 * inter + inter + c]);
    out[i] = from_f<T>(g / (1.f + __expf(-g)) * u);
  }
}

// (best, idx) of the block, in lane 0 of warp 0: the largest value, ties to the lowest index.
__device__ __forceinline__ void argmax_block(float& best, int& idx) {
  warp_argmax(best, idx);
  __shared__ float sb[32];
  __shared__ int si[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { sb[warp] = best; si[warp] = idx; }
  __syncthreads();
  if (warp == 0) {
    int nw = blockDim.x >> 5;
    best = lane < nw ? sb[lane] : -INFINITY;
    idx = lane < nw ? si[lane] : 0x7fffffff;
    warp_argmax(best, idx);
  }
}

template <typename T> struct IsF32 { static constexpr bool value = false; };
template <> struct IsF32<float> { static constexpr bool value = true; };

// Grid (rows, parts): block (r, p) takes part p of row r (parts of a multiple of 4 entries);
// ties go to the lowest index (as torch and candle do). With one part the block writes
// out[r]; otherwise its best value and index go to part_v/part_i [rows, parts] for
// argmax_merge. f32 rows of a multiple of 4 entries (16-byte aligned) are read as float4, four
// loads a thread in flight (a scalar load at a time left a part's ~20 round trips to memory
// in line).
template <typename T>
__device__ void argmax_rows(const T* __restrict__ x, uint32_t* __restrict__ out, int n,
                            float* __restrict__ part_v, int* __restrict__ part_i) {
  const int parts = gridDim.y, p = blockIdx.y;
  const int seg = ((n + parts - 1) / parts + 3) & ~3;
  const int start = min(n, p * seg), end = min(n, start + seg);
  const T* r = x + (size_t)blockIdx.x * n;
  float best = -INFINITY;
  int idx = 0x7fffffff;
  if (IsF32<T>::value && (n & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
    const float4* r4 = reinterpret_cast<const float4*>(r);
    const int s4 = start >> 2, e4 = end >> 2, bd = blockDim.x;
    for (int j0 = s4 + threadIdx.x; j0 < e4; j0 += 4 * bd) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = j0 + u * bd < e4 ? r4[j0 + u * bd] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int j = j0 + u * bd;
        if (j >= e4) break;
        const float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (e[q] > best) { best = e[q]; idx = 4 * j + q; }
      }
    }
  } else {
    for (int i = start + threadIdx.x; i < end; i += blockDim.x) {
      float v = to_f(r[i]);
      if (v > best) { best = v; idx = i; }
    }
  }
  argmax_block(best, idx);
  if (threadIdx.x == 0) {
    if (parts == 1) {
      out[blockIdx.x] = idx == 0x7fffffff ? 0u : (uint32_t)idx;
    } else {
      part_v[blockIdx.x * parts + p] = best;
      part_i[blockIdx.x * parts + p] = idx;
    }
  }
}

// A block per row: the best of the row's parts (ties: lowest index).
__device__ void argmax_merge_rows(const float* __restrict__ part_v, const int* __restrict__ part_i,
                             int parts, uint32_t* __restrict__ out) {
  float best = -INFINITY;
  int idx = 0x7fffffff;
  for (int p = threadIdx.x; p < parts; p += blockDim.x) {
    float v = part_v[blockIdx.x * parts + p];
    int i = part_i[blockIdx.x * parts + p];
    if (v > best || (v == best && i < idx)) { best = v; idx = i; }
  }
  argmax_block(best, idx);
  if (threadIdx.x == 0) out[blockIdx.x] = idx == 0x7fffffff ? 0u : (uint32_t)idx;
}

// out[r] = x[rows[r]] for r < nrows (the embedding lookup too: rows = token ids). Grid
// (chunks of a row, rows), both strided: a row of a vocabulary's logits (600 KB) is copied by
// hundreds of blocks, not one (a single block's dependent loads and stores made it ~0.1 ms).
template <typename T>
__device__ void gather_rows(const T* __restrict__ x, const uint32_t* __restrict__ rows,
                            T* __restrict__ out, int n, int nrows) {
  for (int r = blockIdx.y; r < nrows; r += gridDim.y) {
    const T* src = x + (size_t)rows[r] * n;
    T* dst = out + (size_t)r * n;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
      dst[i] = src[i];
  }
}

// f32 copy of x (logits for the host and for sampling).
template <typename T>
__device__ void to_f32(const T* __restrict__ x, float* __restrict__ out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = to_f(x[i]);
}

// to_f32 of rows [rows, n] and each row's argmax as argmax_rows_f32 and argmax_merge give it
// on that f32 copy (the largest value, ties to the lowest index; 0 for a row with no value
// above -inf), in one launch (LaunchOptions::graph_argmax): grid (rows, parts); block (r, p)
// converts part p of row r and writes its best to pv/pi [rows, parts]; the row's last block to
// finish (counters[r]: zero at allocation, reset by that block) merges the row's parts into
// ids[r], and into feed[r] when feed is given (a decode graph's input ids: the next pipelined
// step's tokens, LaunchOptions::graph_feed). Which parts there are does not change the answer
// (the best value's lowest index).
template <typename T>
__device__ void to_f32_argmax(const T* __restrict__ x, float* __restrict__ out, int n,
                              float* pv, int* pi, uint32_t* counters, uint32_t* __restrict__ ids,
                              uint32_t* __restrict__ feed) {
  const int parts = gridDim.y, p = blockIdx.y, r = blockIdx.x;
  const int seg = ((n + parts - 1) / parts + 3) & ~3;
  const int start = min(n, p * seg), end = min(n, start + seg);
  const T* xr = x + (size_t)r * n;
  float* orow = out + (size_t)r * n;
  float best = -INFINITY;
  int idx = 0x7fffffff;
  for (int i = start + threadIdx.x; i < end; i += blockDim.x) {
    const float v = to_f(xr[i]);
    orow[i] = v;
    if (v > best) { best = v; idx = i; }
  }
  argmax_block(best, idx);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    pv[(size_t)r * parts + p] = best;
    pi[(size_t)r * parts + p] = idx;
    __threadfence();
    last = atomicAdd(&counters[r], 1u) == (uint32_t)parts - 1;
  }
  __syncthreads();  // also: every thread is done with argmax_block's shared memory
  if (!last) return;
  __threadfence();
  best = -INFINITY;
  idx = 0x7fffffff;
  for (int q = threadIdx.x; q < parts; q += blockDim.x) {
    const float v = reinterpret_cast<volatile float*>(pv)[(size_t)r * parts + q];
    const int i = reinterpret_cast<volatile int*>(pi)[(size_t)r * parts + q];
    if (v > best || (v == best && i < idx)) { best = v; idx = i; }
  }
  argmax_block(best, idx);
  if (threadIdx.x == 0) {
    const uint32_t id = idx == 0x7fffffff ? 0u : (uint32_t)idx;
    ids[r] = id;
    if (feed != nullptr) feed[r] = id;
    counters[r] = 0;  // ready for the next launch (a graph's next replay)
  }
}

// The k largest values of each f32 row with their indices, in order (value descending, index
// ascending on ties): k rounds of a block-wide arg-max over the elements that come after the
// previous round's pick in that order. One block per row; k is small (sampling's top-k).
__device__ void topk_rows(const float* __restrict__ x, int n, int k, float* __restrict__ vals,
                          uint32_t* __restrict__ idx) {
  const float* r = x + (size_t)blockIdx.x * n;
  __shared__ float sb[32];
  __shared__ int si[32];
  __shared__ float prev_v;
  __shared__ int prev_i;
  if (threadIdx.x == 0) { prev_v = INFINITY; prev_i = -1; }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int round = 0; round < k; ++round) {
    const float pv = prev_v;
    const int pi = prev_i;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      float v = r[i];
      if (v != v) continue;  // NaN is never a candidate
      if (before(pv, pi, v, i) && before(v, i, best, bi)) { best = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float ob = __shfl_xor_sync(0xffffffffu, best, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (before(ob, oi, best, bi)) { best = ob; bi = oi; }
    }
    if (lane == 0) { sb[warp] = best; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
      best = lane < nw ? sb[lane] : -INFINITY;
      bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (before(ob, oi, best, bi)) { best = ob; bi = oi; }
      }
      if (lane == 0) {
        vals[(size_t)blockIdx.x * k + round] = best;
        idx[(size_t)blockIdx.x * k + round] = bi == 0x7fffffff ? 0u : (uint32_t)bi;
        prev_v = best;
        prev_i = bi;
      }
    }
    __syncthreads();
  }
}

}  // namespace

#define PS_LAYER_OPS(T, NAME)                                                                   \
  extern "C" __global__ void add_rmsnorm_##NAME(const T* x, const T* res_in, T* res_out,      \
                                                const T* w, T* out, int n, float eps, int add) { pdl_entry(); \
    add_rmsnorm<T>(x, res_in, res_out, w, out, n, eps, add);                                    \
  }                                                                                             \
  extern "C" __global__ void silu_mul_##NAME(const T* gu, T* out, long long rows, int inter) { pdl_entry(); \
    silu_mul<T>(gu, out, rows, inter);                                                          \
  }                                                                                             \
  extern "C" __global__ void argmax_rows_##NAME(const T* x, uint32_t* out, int n, float* pv,   \
                                                 int* pi) { pdl_entry();                                     \
    argmax_rows<T>(x, out, n, pv, pi);                                                          \
  }                                                                                             \
  extern "C" __global__ void gather_rows_##NAME(const T* x, const uint32_t* rows, T* out,       \
                                                int n, int nrows) { pdl_entry();                             \
    gather_rows<T>(x, rows, out, n, nrows);                                                     \
  }                                                                                             \
  extern "C" __global__ void to_f32_##NAME(const T* x, float* out, long long n) { pdl_entry();              \
    to_f32<T>(x, out, n);                                                                       \
  }                                                                                             \
  extern "C" __global__ void to_f32_argmax_##NAME(const T* x, float* out, int n, float* pv,     \
                                                  int* pi, uint32_t* counters, uint32_t* ids,   \
                                                  uint32_t* feed) {                             \
    pdl_entry();                                                                                \
    to_f32_argmax<T>(x, out, n, pv, pi, counters, ids, feed);                                   \
  }

PS_LAYER_OPS(__nv_bfloat16, bf16)
PS_LAYER_OPS(float, f32)

extern "C" __global__ void topk_rows_f32(const float* x, int n, int k, float* vals, uint32_t* idx) { pdl_entry();
  topk_rows(x, n, k, vals, idx);
}

// Draws one token per row from its top-k candidates (`vals`/`ids` [rows, K], value descending,
// id ascending on ties, as topk_rows_f32 leaves them): temperature, top-k, top-p, then the
// inverse CDF at the row's uniform `u` (drawn on the host from the request's own generator,
// one per sampled token, as the host sampler draws). The same steps in the same order as the
// host sampler (`engine::sampling::sample_candidates`), in f32. params [rows * 4]:
// temperature, top_p (1: off), u, k (as float). One thread per row.
extern "C" __global__ void sample_topk_f32(const float* vals, const uint32_t* ids,
                                           const float* params, int K, int rows,
                                           uint32_t* out) { pdl_entry();
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* v = vals + (size_t)r * K;
  const uint32_t* id = ids + (size_t)r * K;
  float t = params[4 * r], top_p = params[4 * r + 1], u = params[4 * r + 2];
  int k = min(K, max(1, (int)params[4 * r + 3]));
  // Candidates stop at the first non-finite value (the row had fewer finite logits).
  int n = 0;
  while (n < k && isfinite(v[n])) ++n;
  if (n == 0) { out[r] = id[0]; return; }
  float mx = v[0] / t;
  float p[64];
  float sum = 0.f;
  for (int i = 0; i < n; ++i) { p[i] = expf(v[i] / t - mx); sum += p[i]; }
  for (int i = 0; i < n; ++i) p[i] /= sum;
  int keep = n;
  if (top_p > 0.f && top_p < 1.f) {
    float acc = 0.f;
    for (int i = 0; i < n; ++i) {
      acc += p[i];
      if (acc >= top_p) { keep = i + 1; break; }
    }
    float s2 = 0.f;
    for (int i = 0; i < keep; ++i) s2 += p[i];
    for (int i = 0; i < keep; ++i) p[i] /= s2;
  }
  float acc = 0.f;
  for (int i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) { out[r] = id[i]; return; }
  }
  out[r] = id[keep - 1];
}

// Draws one token per row from the whole vocabulary (no top-k, no top-p): the inverse CDF of
// softmax(x / t) at the row's uniform `u`, walked in token-id order (any fixed order draws
// exactly from the distribution; the host's sampler walks it by probability instead, so the
// two draw different, equally distributed tokens for one `u`). params [rows * 4] as for
// sample_topk_f32; k (as float) 1 marks a greedy row (its argmax, lowest id on ties). One
// block of FULL_THREADS per row: the maximum, then per-thread sums over contiguous chunks,
// a block scan of them, and the thread whose chunk holds u * total walks it.
constexpr int FULL_THREADS = 256;

extern "C" __global__ void __launch_bounds__(FULL_THREADS) sample_full_f32(
    const float* logits, int n, const float* params, uint32_t* out) {
  pdl_entry();
  __shared__ float s_val[FULL_THREADS];
  __shared__ int s_idx[FULL_THREADS];
  const int r = blockIdx.x, tid = threadIdx.x;
  const float* x = logits + (size_t)r * n;
  const float t = params[4 * r], u = params[4 * r + 2];
  const bool greedy = (int)params[4 * r + 3] == 1;
  float m = -INFINITY;
  int mi = n;
  for (int i = tid; i < n; i += FULL_THREADS) {
    const float v = x[i];
    if (isfinite(v) && (v > m || (v == m && i < mi))) { m = v; mi = i; }
  }
  s_val[tid] = m;
  s_idx[tid] = mi;
  __syncthreads();
  for (int w = FULL_THREADS / 2; w > 0; w >>= 1) {
    if (tid < w) {
      const float v = s_val[tid + w];
      const int i = s_idx[tid + w];
      if (v > s_val[tid] || (v == s_val[tid] && i < s_idx[tid])) { s_val[tid] = v; s_idx[tid] = i; }
    }
    __syncthreads();
  }
  m = s_val[0];
  mi = s_idx[0];
  __syncthreads();
  if (mi >= n) {  // no finite logit
    if (tid == 0) out[r] = 0;
    return;
  }
  if (greedy) {
    if (tid == 0) out[r] = (uint32_t)mi;
    return;
  }
  const int chunk = (n + FULL_THREADS - 1) / FULL_THREADS;
  const int lo = min(n, tid * chunk), hi = min(n, lo + chunk);
  float s = 0.f;
  for (int i = lo; i < hi; ++i) {
    const float v = x[i];
    if (isfinite(v)) s += __expf((v - m) / t);
  }
  s_val[tid] = s;
  __syncthreads();
  // Inclusive scan (Hillis-Steele) of the chunk sums.
  for (int off = 1; off < FULL_THREADS; off <<= 1) {
    const float add = tid >= off ? s_val[tid - off] : 0.f;
    __syncthreads();
    s_val[tid] += add;
    __syncthreads();
  }
  const float total = s_val[FULL_THREADS - 1];
  const float target = u * total;
  const float before = tid > 0 ? s_val[tid - 1] : 0.f;
  // The chunk holding the target, or the last chunk with mass when rounding leaves the
  // target past every sum.
  const bool mine = (target >= before && target < s_val[tid] && s > 0.f) ||
                    (tid == FULL_THREADS - 1 && target >= s_val[tid]);
  if (!mine) return;
  float acc = before;
  int last = mi;
  for (int i = lo; i < hi; ++i) {
    const float v = x[i];
    if (!isfinite(v)) continue;
    last = i;
    acc += __expf((v - m) / t);
    if (target < acc) { out[r] = (uint32_t)i; return; }
  }
  if (tid == FULL_THREADS - 1 && s == 0.f) {
    // The last chunk has no mass: the last finite token before it.
    for (int i = n - 1; i >= 0; --i)
      if (isfinite(x[i])) { last = i; break; }
  }
  out[r] = (uint32_t)last;
}

// Log-probabilities of drawn tokens, one pass over each row: for output j, row rows[j] of
// f32 logits scaled by inv_t[j]: out[2j] = its log-sum-exp, out[2j+1] = the log-softmax at
// the token drawn from that row, ids[rows[j]] (the draw's output, still on the device). Per thread an online (max, sum of exp) over a strided slice, then a block
// merge of the pairs. Non-finite logits carry no mass (as -inf does in a softmax).
constexpr int LP_THREADS = 512;

extern "C" __global__ void __launch_bounds__(LP_THREADS) logprob_rows_f32(
    const float* logits, int n, const uint32_t* rows, const float* inv_t,
    const uint32_t* ids, float* out) {
  pdl_entry();
  __shared__ float s_m[LP_THREADS];
  __shared__ float s_s[LP_THREADS];
  const int j = blockIdx.x, tid = threadIdx.x;
  const float* x = logits + (size_t)rows[j] * n;
  const float it = inv_t[j];
  float m = -INFINITY, s = 0.f;
  for (int i = tid; i < n; i += LP_THREADS) {
    const float v = x[i] * it;
    if (!isfinite(v)) continue;
    if (v > m) {
      s = s * __expf(m - v) + 1.f;
      m = v;
    } else {
      s += __expf(v - m);
    }
  }
  s_m[tid] = m;
  s_s[tid] = s;
  __syncthreads();
  for (int w = LP_THREADS / 2; w > 0; w >>= 1) {
    if (tid < w) {
      const float m2 = s_m[tid + w], s2 = s_s[tid + w];
      const float m1 = s_m[tid], s1 = s_s[tid];
      const float mm = fmaxf(m1, m2);
      if (mm == -INFINITY) {
        s_s[tid] = 0.f;
      } else {
        s_s[tid] = (m1 == -INFINITY ? 0.f : s1 * __expf(m1 - mm)) +
                   (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - mm));
      }
      s_m[tid] = mm;
    }
    __syncthreads();
  }
  if (tid == 0) {
    const float lse = s_m[0] + logf(s_s[0]);
    out[2 * j] = lse;
    out[2 * j + 1] = x[ids[rows[j]]] * it - lse;
  }
}

extern "C" __global__ void argmax_merge(const float* part_v, const int* part_i, int parts,
                                        uint32_t* out) { pdl_entry();
  argmax_merge_rows(part_v, part_i, parts, out);
}
