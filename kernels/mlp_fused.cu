// The MLP of a 1-2-row decode step in one launch (LaunchOptions::mlp_fused, bf16): the
// add+RMSNorm before it, gate|up with SiLU*up and down, where the step ran the norm + gate|up
// kernel (`gemv.cu` sdnorm_gemv_silu_*) and then down (gemv_*) behind a whole-grid dependency.
// Here down is split over the intermediate channels (split-K) instead, so no block waits on
// another grid between the two matmuls:
//  * the grid's MLP_BLOCKS (128) blocks run in clusters of CL (16); block b takes
//    the CH = WARPS * CPW channels from b * CH. Before waiting on the kernel before it (o), each
//    warp loads its CPW gate and up rows whole into registers (P chunks of 8 inputs a lane a
//    row, H = 256 P inputs) and the block copies its CH columns of down (H rows) into shared
//    memory with cp.async: the layer's MLP weights are all in flight before the wait;
//  * after it: the deferred norm of res + delta into shared memory (`norm_rows_pre`, as the
//    sdnorm kernel runs it), each warp's dot products in the sdnorm kernel's order, scaled
//    by 1 / rms, and silu(gate) * up rounded to bf16 (these bit for bit the sdnorm kernel's
//    output), kept in shared memory;
//  * the block's down partial over its CH channels for every output row (f32, in channel
//    order), each row stored into the shared memory of the cluster rank that sums it (rank r
//    takes rows [r H / CL, (r + 1) H / CL)); the blocks' start is awaited by a cluster barrier
//    arrived at before the wait, the stores by one after them;
//  * the cluster's sum of its CL blocks' partials (in rank order), written to parts
//    [T][NPARTS][H] f32 (NPARTS = MLP_BLOCKS / CL = 8 cluster sums): the next layer's
//    deferred norm kernel adds them in order and rounds the sum to bf16 where it added down's
//    bf16 output (`gemv.cuh` norm_rows_parts).
// (Measured on the H200, BENCHMARKS.md #21: clusters of 8, whose 16 partials cost the next
// kernel more, and each rank loading its rows from every block behind two barriers, slower.)
// Block 0 writes bf16(res + delta) to res_out, as the norm kernels do. The sums of down run in
// another order than the down kernel's (channels by block, blocks by cluster rank, clusters),
// so the step's bits differ from the unfused path's in rounding.

#include "cluster.cuh"
#include "gemv.cuh"

namespace {

constexpr int MLP_BLOCKS = 128;
constexpr int CL = 16;  // blocks a cluster

// Dynamic shared memory of a block: down's columns (H x CH bf16), the normed rows (T x H bf16),
// silu(gate) * up (T x CH f32) and the down partial (T x H f32).
template <int T, int CPW, int P>
constexpr int mlp_smem_bytes() {
  return 256 * P * WARPS * CPW * 2 + T * 256 * P * 2 + T * WARPS * CPW * 4 + T * 256 * P * 4;
}

template <int T, int CPW, int P>
__device__ __forceinline__ void mlp_fused(const __nv_bfloat16* __restrict__ gu_w,
                                          const __nv_bfloat16* __restrict__ down_w,
                                          const __nv_bfloat16* __restrict__ res,
                                          const __nv_bfloat16* __restrict__ delta,
                                          __nv_bfloat16* __restrict__ res_out,
                                          const __nv_bfloat16* __restrict__ nw, float eps,
                                          float* __restrict__ parts, int I) {
  constexpr int H = 256 * P;          // hidden: gate|up's inputs, down's rows
  constexpr int CH = WARPS * CPW;     // channels of a block
  constexpr int CV = CH / 8;          // 16-byte pieces of a down row's CH columns
  constexpr int NPARTS = MLP_BLOCKS / CL;
  constexpr int RH = H / CL;          // output rows a cluster rank sums
  static_assert(CH % 8 == 0 && P <= BATCH && T * RH <= WARPS * 32, "shape");
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* down_s = reinterpret_cast<__nv_bfloat16*>(smem);  // [H][CH]
  __nv_bfloat16* x_s = down_s + H * CH;                            // [T][H]
  float* act_s = reinterpret_cast<float*>(x_s + T * H);             // [T][CH]
  float* part_s = act_s + T * CH;  // [CL][T][RH]: the rows this rank sums, by block

  pdl_trigger();
  cluster_arrive();  // this block has started (awaited before the first store)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.x;
  const int c0 = b * CH;
  const int rank = b % CL;
  // 1. The weights, before the wait: this warp's gate and up rows in registers, the block's
  //    columns of down into shared memory.
  uint4 w[CPW][2][BATCH];
#pragma unroll
  for (int cp = 0; cp < CPW; ++cp)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const size_t row = (size_t)r * I + c0 + warp * CPW + cp;
#pragma unroll
      for (int p = 0; p < P; ++p) w[cp][r][p] = ld_stream(gu_w + row * H + (lane + 32 * p) * 8);
    }
  for (int i = threadIdx.x; i < H * CV; i += WARPS * 32) {
    const int n = i / CV, v = i % CV;
    cp_async16(smem_addr(down_s + n * CH + v * 8), down_w + (size_t)n * I + c0 + v * 8, true);
  }
  cp_async_commit();
  __nv_bfloat16 wk[NW_REGS];
#pragma unroll
  for (int e = 0; e < NW_REGS; ++e) {
    const int k = threadIdx.x + e * WARPS * 32;
    wk[e] = k < H ? nw[k] : __float2bfloat16(0.f);
  }
  pdl_wait();

  // 2. The deferred norm, gate|up, silu(gate) * up.
  float inv[T];
  norm_rows_pre<T, true>(res, delta, res_out, wk, eps, 1, H, x_s, inv);
  const PlainX xs{x_s, H};
#pragma unroll
  for (int cp = 0; cp < CPW; ++cp) {
    float acc[2][T];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
#pragma unroll
    for (int p = 0; p < P; ++p) sum_chunk<T, 2>(xs, lane + 32 * p, w[cp], p, acc);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
    scale_rows<T, 2>(acc, inv);
#pragma unroll
    for (int t = 0; t < T; ++t)
      if (lane == t) {
        const float g = acc[0][t];
        const float v = g / (1.f + __expf(-g)) * acc[1][t];
        act_s[t * CH + warp * CPW + cp] = __bfloat162float(__float2bfloat16(v));
      }
  }
  cp_async_wait<0>();
  __syncthreads();

  // 3. The block's down partial over its channels, into the summing rank's memory.
  cluster_wait();
#pragma unroll
  for (int e = 0; e < P; ++e) {
    const int n = threadIdx.x + e * WARPS * 32;
    float wf[CH];
#pragma unroll
    for (int v = 0; v < CV; ++v)
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(down_s + n * CH + v * 8), wf + v * 8);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float s = 0.f;
#pragma unroll
      for (int c = 0; c < CH; ++c) s = fmaf(wf[c], act_s[t * CH + c], s);
      *cluster_peer(part_s + (rank * T + t) * RH + n % RH, n / RH) = s;
    }
  }

  // 4. The cluster's sum, rank by rank.
  cluster_arrive();
  cluster_wait();
  if (threadIdx.x < T * RH) {
    const int t = threadIdx.x / RH, j = threadIdx.x % RH;
    float v[CL];
#pragma unroll
    for (int q = 0; q < CL; ++q) v[q] = part_s[(q * T + t) * RH + j];
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < CL; ++q) s += v[q];
    parts[((size_t)t * NPARTS + b / CL) * H + rank * RH + j] = s;
  }
}

}  // namespace

// (gu_w [2I, H], down_w [H, I], res, delta, res_out [T, H] bf16, norm weight [H], eps, parts
// [T][MLP_BLOCKS / CL][H] f32, I); grid MLP_BLOCKS in clusters of CL, 256 threads,
// mlp_smem_bytes of dynamic shared memory. Two blocks an SM at most (128 registers), so
// clusters place more freely (the first form, one block an SM at 151 registers with the loads
// and two barriers, measured 12% slower on the H200).
#define MLP_ENTRY(T, CPW, P)                                                                     \
  extern "C" __global__ void __launch_bounds__(WARPS * 32, 2)                                  \
      mlp_fused_t##T##_c##CPW##_p##P(                                                          \
          const __nv_bfloat16* gu_w, const __nv_bfloat16* down_w, const __nv_bfloat16* res,    \
          const __nv_bfloat16* delta, __nv_bfloat16* res_out, const __nv_bfloat16* nw,         \
          float eps, float* parts, int I) {                                                    \
    mlp_fused<T, CPW, P>(gu_w, down_w, res, delta, res_out, nw, eps, parts, I);                \
  }

// Qwen3-0.6B's shape: H 1,024 (P 4), I 3,072 = 128 blocks x 24 channels (CPW 3).
static_assert(mlp_smem_bytes<2, 3, 4>() == 61632, "mlp_smem in src/engine/cuda/mlp_fused.rs, two rows");
MLP_ENTRY(1, 3, 4)
MLP_ENTRY(2, 3, 4)
