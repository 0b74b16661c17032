// The fused decode attention: one launch per layer for pure decode steps of few sequences
// (see the comment on decode_fused below).

// The block timeline's phases of this kernel (the `timeline` feature only; TL_MARK is nothing
// otherwise): 1 q/k normed and roped, 2 the loop done, 3 the cluster's blocks all running, 4
// the partial pushed, 5 (block 0 of a cluster) every partial in, 6 the output written.
#define TL_SLOTS 7
#include "cluster.cuh"
#include "decode_mma.cuh"
#include "fused_parts.cuh"

namespace {

// A whole decode step's attention for one layer in one launch (bf16, head_dim 128): what the
// unfused path does in three kernels (qk_norm_rope_kv_write, paged_decode, and the merge),
// with the same arithmetic. Grid (B, nkv, splits) as paged_decode, optionally in clusters of
// C blocks along the partitions (sm_90; C divides splits). A block
//  1. before waiting on the kernel before it (the qkv matmul), loads the K/V rows of its
//     partition's first FETCH tokens per half-warp: they were written by earlier steps, and
//     nothing in this step writes them (the new token's row is not among them);
//  2. norms and rotates its G query heads from the qkv row (one warp per head, the helper the
//     unfused kernel uses) into shared memory, rounded to bf16 as the unfused path stores q;
//     if its partition holds the new token (position ctx - 1), also the new key, which it
//     writes with the value to the cache and keeps in shared memory;
//  3. attends over its partition (paged_decode's loop, FETCH tokens' loads in flight at once);
//  4. merges: with one partition it writes the output; in a cluster, every block writes its
//     partial into block 0's shared memory and block 0 merges them (a context of up to
//     C * CLUSTER_PART tokens is one cluster's: partitions of ceil(ctx / C) tokens, so the
//     output is written there); otherwise the partials (the blocks', or the clusters') go
//     through global memory and the last to finish (a counter per sequence and KV head, reset
//     by that block) merges them.
// Bits: without clusters, and for contexts one cluster holds, the output equals the unfused
// kernels' at the same partitioning (the merge sums the same terms in the same order); across
// clusters the merge is two-level and differs in rounding only.
// The cluster's push (step 4): the peers store their partials into block 0 by st.async, counted
// on block 0's mbarrier, which block 0 waits on instead of a second cluster barrier (whose
// release made every thread wait for its memory operations at GPU scope; round 55).
// The tensor-core kernels (MMA > 0) are built for the only launches the host makes of them (in
// clusters, every context within one, no profiling stop: `tc` below is then always true), so
// they carry no CUDA-core loop, one-partition output or merge through global memory: ~40% of
// the machine code they had, and on the H100 0.6B batch 1 / 2 +2.9% / +3.0%, 1.7B +2.2% /
// +0.7%, the 30B-A3B shape +0.9% (round 56; BENCHMARKS.md). A launch that breaks the rule traps.
// kv_shift: the grid's KV heads are virtual, 2^kv_shift of them a head of the cache (GQA group
// 8 runs as two group-4 halves a KV head, which merge in clusters; G is then 4): each reads
// its cache head's K/V and norms its new key; the first writes the new row.
// qkv rows hold q heads, k heads, v heads; a padding row (context 0) writes zeros. `stop`
// (profiling only, the CUDA-core kernels; 0 in the engine, and no clusters) ends every block
// after phase 1-4 (4: the partial formed), so `graph_check --profile` can time the phases.
// FETCH: tokens per half-warp whose K/V loads are in flight together (a round of GROUPS *
// FETCH tokens a block; eight, and two rounds of four, lost 14-36% at 8k-32k tokens: #21).
constexpr int FETCH = 4;
constexpr int CLUSTER_PART = 128;  // longest partition of a context one cluster covers
// KT: the caches' element type (bf16, or fp8 with the scales ks / vs: K's folded into q, the
// new token's K/V kept in shared memory as stored, so both paths read the same values).
// MMA (LaunchOptions::fused_mma; 0: off): for a context one cluster holds, step 3 on tensor
// cores, paged_decode_mma's loop (decode_mma.cu: a warp takes every fourth chunk of 16 tokens
// through MMA stages of dynamic shared memory a warp, issued before the wait; the new token's
// row patched into its stage from shared memory) and its merge of the warps: the bits of the
// unfused tensor-core kernels at the same partitioning, as the CUDA-core loop gives
// paged_decode's. The host launches these kernels only for steps whose contexts all fit (a
// CUDA-core loop here, at 113 registers, lost 23-33% after 8k-32k tokens on the H200), and
// since round 56 they hold no other loop (the paragraph above).
// LEAN (LaunchOptions::fused_lean, on by default): the same sums in the same order with fewer
// instructions a token: a power-of-two block size's table index and offset by shift and mask
// instead of a division. (A round's scores before its softmax steps lost 9-27%: #21.)
template <int G, typename KT, bool LEAN, int MMA>
__device__ void decode_fused(const __nv_bfloat16* __restrict__ qkv,
                             const __nv_bfloat16* __restrict__ q_w,
                             const __nv_bfloat16* __restrict__ k_w,
                             const float* __restrict__ inv_freq,
                             const uint32_t* __restrict__ positions,
                             const uint32_t* __restrict__ slots, KT* k_cache,
                             KT* v_cache, const uint32_t* __restrict__ block_tables,
                             const uint32_t* __restrict__ ctx_lens,
                             __nv_bfloat16* __restrict__ out, float* part_acc, float* part_ml,
                             uint32_t* counters, int W, const uint32_t* __restrict__ width,
                             int block_size, long long num_slots, int nkv, int part_min,
                             float ks, float vs, float eps, int stop, int kv_shift) {
  using T = __nv_bfloat16;
  using Raw = typename KvRaw<KT>::type;
  pdl_trigger();
  const int b = blockIdx.x, kh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int nh = nkv * G;
  // The cache's KV head of this block's heads, and the cache's KV head count (see kv_shift).
  const int rk = kh >> kv_shift, nkr = nkv >> kv_shift;
  const int C = cluster_blocks();
  // The step's inputs were uploaded before the step's first kernel: readable before the wait.
  const int ctx = (int)ctx_lens[b];
  if (width != nullptr) W = (int)*width;
  constexpr bool TCO = MMA > 0;  // the tensor-core kernels' launch rule (above)
  if constexpr (TCO) stop = 0;
  if (TCO && !(C > 1 && ctx <= C * CLUSTER_PART)) __trap();  // the host's launch rule broken
  const bool one_cluster = TCO || (C > 1 && ctx <= C * CLUSTER_PART);
  const int part = one_cluster ? decode_part(ctx, C, 16) : decode_part(ctx, splits, part_min);
  const int start = split * part;
  // A cluster (or block) wholly past the context has nothing to write; the test is the same
  // for every block of a cluster, so none is left waiting at a cluster barrier.
  if (ctx > 0 && (split / C) * C * part >= ctx) return;
  // Block 0's barrier for the partials its peers push (step 4), set up before the arrival
  // below makes it visible to them: their bytes, G heads' A, M and L a peer.
  __shared__ __align__(8) uint64_t push_bar;
  const bool clustered = TCO || (C > 1 && splits > 1 && stop == 0);
  if (clustered && split % C == 0 && threadIdx.x == 0)
    push_bar_init(&push_bar, (uint32_t)((C - 1) * (G * HD + 2 * G) * sizeof(float)));
  // In a cluster: every block has started before any writes another's shared memory (step 4);
  // this arrival is waited for there.
  if (TCO || C > 1) cluster_arrive();
  const int end = min(ctx, start + part);  // <= start for a partition past the context
  const int newp = ctx - 1;
  const int grp = threadIdx.x / LANES, lane = threadIdx.x % LANES;
  const uint32_t* table = block_tables + (size_t)b * W;
  const size_t head_base = (size_t)rk * num_slots;
  // MMA: the warp's stages, and the warps' states over them once every warp is done.
  extern __shared__ __align__(16) unsigned char dsm[];
  constexpr int SB = stage_bytes<KT>();

  // 1: this half-warp's tokens base + grp + GROUPS * u, their K/V rows (not the new token's).
  Raw kr[FETCH], vr[FETCH];
  const bool bs_pow2 = LEAN && (block_size & (block_size - 1)) == 0;
  const int bs_shift = 31 - __clz(block_size);
  auto fetch = [&](int base) {
#pragma unroll
    for (int u = 0; u < FETCH; ++u) {
      const int p = base + grp + GROUPS * u;
      if (p < end && p != newp) {
        const int tb = bs_pow2 ? p >> bs_shift : p / block_size;
        const int to = bs_pow2 ? p & (block_size - 1) : p % block_size;
        const size_t slot = (size_t)table[tb] * block_size + to;
        const size_t off = (head_base + slot) * HD + lane * PER;
        kr[u] = *reinterpret_cast<const Raw*>(k_cache + off);
        vr[u] = *reinterpret_cast<const Raw*>(v_cache + off);
      }
    }
  };
  // With MMA, a context one cluster holds takes the tensor-core loop (uniform in a block).
  const bool tc = MMA > 0 && one_cluster;
  if (tc) {
    if constexpr (MMA > 0) {
      // The warp's first MMA chunks (warp, warp + 4, ...) into its stages, a group each.
      const int warp = threadIdx.x / 32, chunks = mma_chunks(start, end);
      const MmaTable tb = mma_table(table, block_size, start);
#pragma unroll
      for (int i = 0; i < MMA; ++i) {
        const int ci = warp + i * MMA_WARPS;
        if (ci < chunks)
          stage_load<KT>(dsm + (warp * MMA + i) * SB, k_cache, v_cache, tb, head_base,
                         start + ci * CHUNK, end, threadIdx.x % 32);
        cp_async_commit();
      }
    }
  } else {
    fetch(start);
  }
  pdl_wait();
  if (stop == 1) {
    if constexpr (MMA > 0) cp_async_wait<0>();
    return;
  }
  if (ctx == 0) {  // the same for the whole row b
    if (split == 0)
      for (int i = threadIdx.x; i < G * HD; i += THREADS)
        out[((size_t)b * nh + kh * G) * HD + i] = (T)0.f;
    return;
  }

  // 2: q heads into shared memory; the new key and value into the cache and shared memory.
  const bool active = start < ctx;
  const bool holds_new = active && end == ctx;
  __shared__ __align__(16) T qs[G][HD];
  __shared__ __align__(16) KT knew[HD];
  __shared__ __align__(16) KT vnew[HD];
  if (active) {
    const int warp = threadIdx.x / 32, wl = threadIdx.x % 32;
    const T* row = qkv + (size_t)b * (nh + 2 * nkr) * HD;
    const float pos = (float)positions[b];
    // More heads than warps (group 4 and up: G q heads and the new key over 4 warps): a warp's
    // heads h and h + 4 normed and rotated together (norm_rope_two), so the new key's block
    // waits on one round of loads instead of two (round 53: +1.6-1.8% on the 30B-A3B shape).
    constexpr int NW = THREADS / 32;
    if constexpr (G + 1 > NW) {
      const int nheads = G + (holds_new ? 1 : 0);
      auto src = [&](int h) {
        return row + (size_t)(h < G ? kh * G + h : nh + rk) * HD;
      };
      auto emit = [&](int h, const float(&o)[HD / 32]) {
        if (h < G) {
#pragma unroll
          for (int j = 0; j < HD / 32; ++j) qs[h][wl + 32 * j] = (T)o[j];
        } else {
          const T* vsrc = row + (size_t)(nh + nkr + rk) * HD;
          // The first of a cache head's blocks writes its new row (the others keep their own
          // copy in shared memory and never read that row from the cache).
          const bool write = slots[b] != 0xffffffffu && (kh & ((1 << kv_shift) - 1)) == 0;
          const size_t off = ((size_t)rk * num_slots + (write ? slots[b] : 0)) * HD;
#pragma unroll
          for (int j = 0; j < HD / 32; ++j) {
            const KT kv = kv_store<KT>(o[j], 1.f / ks);
            const KT vv = kv_store<KT>(to_f(vsrc[wl + 32 * j]), 1.f / vs);
            knew[wl + 32 * j] = kv;
            vnew[wl + 32 * j] = vv;
            if (write) {
              k_cache[off + wl + 32 * j] = kv;
              v_cache[off + wl + 32 * j] = vv;
            }
          }
        }
      };
      for (int h = warp; h < nheads; h += 2 * NW) {
        const int h2 = h + NW;
        const bool two = h2 < nheads;
        float o[HD / 32], o2[HD / 32];
        norm_rope_two<T, HD / 32>(src(h), h < G ? q_w : k_w, src(two ? h2 : h),
                                  (two ? h2 : h) < G ? q_w : k_w, two, inv_freq, pos, eps, wl,
                                  o, o2);
        emit(h, o);
        if (two) emit(h2, o2);
      }
    } else {
      // At most one head a warp (groups 1-2); through `emit` above ptxas gave other machine code.
      for (int h = warp; h < G + (holds_new ? 1 : 0); h += THREADS / 32) {
        const bool is_q = h < G;
        float o[HD / 32];
        norm_rope_head<T, HD / 32>(row + (size_t)(is_q ? kh * G + h : nh + rk) * HD,
                                   is_q ? q_w : k_w, inv_freq, pos, eps, wl, o);
        if (is_q) {
#pragma unroll
          for (int j = 0; j < HD / 32; ++j) qs[h][wl + 32 * j] = (T)o[j];
        } else {
          const T* vsrc = row + (size_t)(nh + nkr + rk) * HD;  // as `emit` above
          const bool write = slots[b] != 0xffffffffu && (kh & ((1 << kv_shift) - 1)) == 0;
          const size_t off = ((size_t)rk * num_slots + (write ? slots[b] : 0)) * HD;
#pragma unroll
          for (int j = 0; j < HD / 32; ++j) {
            const KT kv = kv_store<KT>(o[j], 1.f / ks);
            const KT vv = kv_store<KT>(to_f(vsrc[wl + 32 * j]), 1.f / vs);
            knew[wl + 32 * j] = kv;
            vnew[wl + 32 * j] = vv;
            if (write) {
              k_cache[off + wl + 32 * j] = kv;
              v_cache[off + wl + 32 * j] = vv;
            }
          }
        }
      }
    }
  }
  __syncthreads();
  TL_MARK(1);
  if (stop == 2) return;

  // 3: paged_decode's loop (the same tokens in the same order), FETCH tokens at a time; or
  // (tc) paged_decode_mma's. The CUDA-core loop's half-warp states: static shared memory, or
  // with MMA over the stages (dynamic), which leaves four blocks an SM.
  constexpr int NG = MMA > 0 ? 1 : GROUPS;
  __shared__ float sm_[NG][G], sl_[NG][G];
  __shared__ float sacc_[NG][G][HD];
  GroupStates<G>* dgs = reinterpret_cast<GroupStates<G>*>(dsm);
  float(&sm)[GROUPS][G] = MMA > 0 ? dgs->m : *reinterpret_cast<float(*)[GROUPS][G]>(&sm_[0][0]);
  float(&sl)[GROUPS][G] = MMA > 0 ? dgs->l : *reinterpret_cast<float(*)[GROUPS][G]>(&sl_[0][0]);
  float(&sacc)[GROUPS][G][HD] =
      MMA > 0 ? dgs->acc : *reinterpret_cast<float(*)[GROUPS][G][HD]>(&sacc_[0][0][0]);
  if (tc) {
    if constexpr (MMA > 0) {
      const int warp = threadIdx.x / 32, wl = threadIdx.x % 32, gr = wl / 4, t = wl % 4;
      const int chunks = mma_chunks(start, end);
      const MmaTable tb = mma_table(table, block_size, start);
      unsigned char* wsm = dsm + warp * MMA * SB;
      const float sc = ks * LOG2E;
      MmaState st;
      mma_state_empty(st);
      // Iteration k waits for the oldest of the warp's MMA groups (chunk c), attends to it, then
      // refills its stage with chunk c + 4 MMA (a group each, empty past the last).
#pragma unroll 1
      for (int k = 0, c = warp; c < chunks; ++k, c += MMA_WARPS) {
        unsigned char* stg = wsm + (k % MMA) * SB;
        const int cb = start + c * CHUNK;
        cp_async_wait<MMA - 1>();
        __syncwarp();
        if (holds_new && newp >= cb && newp < cb + CHUNK) {
          // The stage holds the cache's row of the new token as it was; this block has it as
          // written in knew / vnew.
          stage_put_row<KT>(stg, newp - cb, knew, vnew, wl);
          __syncwarp();
        }
        // q's fragment from shared memory for each chunk: 16 registers fewer across the loop
        // (128 a thread: four blocks an SM).
        uint32_t qa[16];
        mma_q_frags<KT, G>(&qs[0][0], gr, t, qa);
        mma_chunk<KT, false, true>(stg, qa, sc, cb, end, gr, t, st);
        // Every lane has read the stage before it is refilled.
        __syncwarp();
        const int cn = c + MMA * MMA_WARPS;
        if (cn < chunks)
          stage_load<KT>(stg, k_cache, v_cache, tb, head_base, start + cn * CHUNK, end, wl);
        cp_async_commit();
      }
      cp_async_wait<0>();
      if (stop == 3) {
        if (st.m == 12345.f) out[0] = (T)(st.l + st.acc[0][0]);
        return;
      }
      __syncthreads();  // every warp is done with its stages: the states go over them
      mma_store_warp<KT, G>(st, vs, warp, gr, t, *reinterpret_cast<MmaWarps<G>*>(dsm));
    }
  } else {
    float qv[G][PER];
#pragma unroll
    for (int g = 0; g < G; ++g) load8(&qs[g][lane * PER], qv[g]);
    if constexpr (IsFp8<KT>::value) {
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < PER; ++i) qv[g][i] *= ks;
    }
    float m[G], l[G], acc[G][PER];
    empty_groups<G>(m, l, acc);
    for (int base = start; base < end; base += GROUPS * FETCH) {
      if (base != start) fetch(base);
#pragma unroll
      for (int u = 0; u < FETCH; ++u) {
        const int p = base + grp + GROUPS * u;
        const bool valid = p < end;
        float kv[PER];
        if (!valid) {
#pragma unroll
          for (int i = 0; i < PER; ++i) kv[i] = 0.f;
        } else if (p == newp) {
          load8(&knew[lane * PER], 1.f, kv);
        } else {
          raw8_to_f32(kr[u], 1.f, kv);
        }
        float sc[G];
        head_scores<G>(qv, kv, sc);
        if (!valid) continue;
        if (p == newp) load8(&vnew[lane * PER], vs, kv);
        else raw8_to_f32(vr[u], vs, kv);
        softmax_step<G>(sc, kv, m, l, acc);
      }
    }
    if (stop == 3) {
      // Keep the loop's results live (a profiling stop must not let the compiler drop it).
      if (m[0] == 12345.f) out[0] = (T)(l[0] + acc[0][0]);
      return;
    }
    store_groups<G>(m, l, acc, grp, lane, sm, sl, sacc);
  }
  __syncthreads();
  TL_MARK(2);

  // 4: the block's partial (M, L, A per head and dim) from its half-warps'; in a cluster it
  // goes straight into block 0's shared memory (slot = this block's rank).
  // Cluster slots: 16 blocks for G <= 2, 8 for G 4, none for G 8 (shared memory bounds it;
  // the host launches accordingly).
  constexpr int CP = G <= 2 ? 16 : (G <= 4 ? 8 : 1);
  __shared__ float pM[CP][G], pL[CP][G];
  __shared__ float pA[CP][G][HD];
  const int rank = split % C;
  float* dM = nullptr;
  float* dL = nullptr;
  float* dA = nullptr;
  // A peer's slot and block 0's barrier as shared::cluster addresses (st.async).
  bool pushing = false;
  uint32_t rM = 0, rL = 0, rA = 0, rbar = 0;
  if (clustered) {
    if (C > CP) __trap();
    cluster_wait();  // every block of the cluster runs: block 0's shared memory is there
    TL_MARK(3);
    if (rank != 0) {
      pushing = true;
      rM = cluster_addr(&pM[rank][0], 0);
      rL = cluster_addr(&pL[rank][0], 0);
      rA = cluster_addr(&pA[rank][0][0], 0);
      rbar = cluster_addr(&push_bar, 0);
    } else {
      dM = &pM[0][0];
      dL = &pL[0][0];
      dA = &pA[0][0][0];
    }
  }
  const size_t hb = (size_t)b * nh + kh * G;
  for (int idx = threadIdx.x; idx < G * HD; idx += THREADS) {
    const int g = idx / HD, d = idx % HD;
    float M, L, A;
    if (tc) {
      mma_merge_warps<G>(*reinterpret_cast<const MmaWarps<G>*>(dsm), g, d, M, L, A);
      if (M != -INFINITY) M *= LN2;  // the merges below weigh by e^(m - M)
    } else {
      merge_groups<G>(sm, sl, sacc, g, d, M, L, A);
    }
    if (!TCO && splits == 1) {
      out[(hb + g) * HD + d] = (T)(L > 0.f ? A / L : 0.f);
    } else if (dA != nullptr) {
      dA[g * HD + d] = A;
      if (d == 0) { dM[g] = M; dL[g] = L; }
    } else if (TCO || pushing) {
      push_f32(rA + (uint32_t)(g * HD + d) * 4u, A, rbar);
      if (d == 0) {
        push_f32(rM + (uint32_t)g * 4u, M, rbar);
        push_f32(rL + (uint32_t)g * 4u, L, rbar);
      }
    } else {
      const size_t pi = (hb + g) * splits + split;
      part_acc[pi * HD + d] = A;
      if (d == 0) { part_ml[pi * 2] = M; part_ml[pi * 2 + 1] = L; }
    }
  }
  if (!TCO && (splits == 1 || stop == 4)) return;
  const int used = min(splits, (ctx + part - 1) / part);
  if (!TCO && dA == nullptr && !pushing) {
    merge_global<G>(part_acc, part_ml, &counters[b * nkv + kh], used, hb, splits, out);
    return;
  }
  // Block 0 merges the cluster's partials (those holding context, in partition order) from
  // its own shared memory: its slot by its threads (the barrier below), the peers' once its
  // push barrier has counted their bytes. With MMA (1-2 rows) the peers run that merge with
  // nothing to merge and no stores (`dry`) before they exit, so the SM that next hosts a block
  // 0 has its code cached (round 55: its merge 3.1 -> 2.0 us; 0.6B batch 1 +3.6%); the
  // CUDA-core kernels (3+ rows) exit at once (the dry run lost 10-19% at batch 8).
  TL_MARK(4);
  const bool dry = MMA > 0 && rank != 0;
  if (MMA == 0 && rank != 0) return;
  if (!dry) {
    __syncthreads();
    push_bar_wait(&push_bar);
    TL_MARK(5);
  }
  const int cl = split / C, cused = dry ? 0 : min(C, used - cl * C);
  const bool last_level = TCO || used <= C;
  // Each partial's weight e^(M_r - M) and each head's max and sum once, by the first warp
  // (lane g * CP + r: G * CP <= 32); then every output is one unrolled run of FMAs: the sums of
  // a loop over the partials an output, in the same order (round 53: +0.3-0.9%).
  static_assert(G * CP <= 32, "one warp forms the weights");
  __shared__ float wR[CP][G], mG[G], lG[G];
  // Inlined where it spills nothing (groups 1-4; group 8's tensor-core kernels spill anyway).
  if (threadIdx.x < 32) {
    if constexpr (G <= 4) merge_weights_body<G, CP>(pM, pL, cused, wR, mG, lG);
    else merge_weights<G, CP>(pM, pL, cused, wR, mG, lG);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * HD; idx += THREADS) {
    const int g = idx / HD, d = idx % HD;
    const float M = mG[g], L = lG[g];
    float A = 0.f;
    if (M != -INFINITY || dry) {
#pragma unroll
      for (int r = 0; r < CP; ++r)
        if (r < cused) A += pA[r][g][d] * wR[r][g];
    }
    if (dry) continue;
    if (last_level) {
      out[(hb + g) * HD + d] = (T)(L > 0.f ? A / L : 0.f);
    } else {
      const size_t pi = (hb + g) * splits + cl;
      part_acc[pi * HD + d] = A;
      if (d == 0) { part_ml[pi * 2] = M; part_ml[pi * 2 + 1] = L; }
    }
  }
  if (!dry) TL_MARK(6);
  if (last_level || dry) return;
  __syncthreads();
  merge_global<G>(part_acc, part_ml, &counters[b * nkv + kh], (used + C - 1) / C, hb, splits,
                  out);
}

}  // namespace

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
