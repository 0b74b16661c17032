// The MoE experts' matmuls on tensor cores (bf16; launchers: src/engine/cuda/moe_ops.rs): per
// tile of BM (16 or 64) pairs of one expert (the tiles of moe.cu's `moe_align`), gate|up with
// SiLU*up and down as wmma 16x16x16 over cp.async double-buffered shared-memory stages,
// rounded as moe.cu's CUDA-core tiles round them.
#include <cuda_bf16.h>
#include <mma.h>
#include <stdint.h>

#include "common.cuh"
#include "moe.cuh"

namespace mma_tile {
using namespace nvcuda;
constexpr int BN = 64, BK = 64, LD = BK + 8, LDC = BN + 4;

__device__ __forceinline__ void cp16(void* dst, const void* src) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_groups() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Shared memory of a block: two stages of the A (BM rows) and B (BN rows) tiles of BK inputs;
// the f32 result tile aliases them once the loop is done.
template <int BM>
struct Smem {
  static constexpr int BYTES = 2 * (BM + BN) * LD * 2;
  static_assert(BYTES >= BM * LDC * 4, "the result tile fits in the stages");
};

// C[BM x 64] (f32, row-major at `raw`, LDC) = A · Bᵀ over `len` inputs (a multiple of BK): A's
// row m is `a[m]`, B's row j is `b[j]`. 128 threads; BM 16: the 4 warps side by side, one
// 16 x 16 fragment each; BM 64: 2 x 2 warps of 2 x 2 fragments. Tiles come by cp.async, the
// next one loading while the tensor cores take the current one.
template <int BM>
__device__ __forceinline__ void tile_gemm(const __nv_bfloat16* const* a, const __nv_bfloat16* const* b,
                                     int len, unsigned char* raw) {
  constexpr int WR = BM == 16 ? 1 : 2, WC = 4 / WR;
  constexpr int FR = BM / WR / 16, FC = BN / WC / 16;
  auto st = reinterpret_cast<__nv_bfloat16(*)[BM + BN][LD]>(raw);
  const int tid = threadIdx.x, warp = tid >> 5;
  const int wr = warp / WC, wc = warp % WC;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FR][FC];
#pragma unroll
  for (int i = 0; i < FR; ++i)
#pragma unroll
    for (int j = 0; j < FC; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  auto stage_load = [&](int s, int k0) {
    for (int c = tid; c < (BM + BN) * (BK / 8); c += 128) {
      const int r = c / (BK / 8), col = (c % (BK / 8)) * 8;
      cp16(&st[s][r][col], (r < BM ? a[r] : b[r - BM]) + k0 + col);
    }
    cp_commit();
  };
  const int steps = len / BK;
  stage_load(0, 0);
  for (int i = 0; i < steps; ++i) {
    if (i + 1 < steps) {
      stage_load((i + 1) & 1, (i + 1) * BK);
      wait_groups<1>();
    } else {
      wait_groups<0>();
    }
    __syncthreads();
    const int s = i & 1;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[FR];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[FC];
#pragma unroll
      for (int f = 0; f < FR; ++f)
        wmma::load_matrix_sync(fa[f], &st[s][wr * (BM / WR) + f * 16][kk], LD);
#pragma unroll
      for (int f = 0; f < FC; ++f)
        wmma::load_matrix_sync(fb[f], &st[s][BM + wc * (BN / WC) + f * 16][kk], LD);
#pragma unroll
      for (int i2 = 0; i2 < FR; ++i2)
#pragma unroll
        for (int j = 0; j < FC; ++j) wmma::mma_sync(acc[i2][j], fa[i2], fb[j], acc[i2][j]);
    }
    __syncthreads();  // the stage is free for the load after next (and, last, for C)
  }
  float* cs = reinterpret_cast<float*>(raw);
#pragma unroll
  for (int i = 0; i < FR; ++i)
#pragma unroll
    for (int j = 0; j < FC; ++j)
      wmma::store_matrix_sync(cs + (wr * (BM / WR) + i * 16) * LDC + wc * (BN / WC) + j * 16,
                              acc[i][j], LDC, wmma::mem_row_major);
  __syncthreads();
}

// Grid (inter / 32, tiles), 128 threads: block (bx, tile) computes gate rows bx * 32.. and the
// same up rows for the tile's (up to BM) pairs, then act = silu(gate) * up as the narrow
// kernels round it. inter and hidden are multiples of 64.
template <int BM>
__device__ void tc_gate_up(const __nv_bfloat16* __restrict__ x,
                        const __nv_bfloat16* __restrict__ gate_up_w,
                        const uint32_t* __restrict__ order, const uint32_t* __restrict__ tiles,
                        __nv_bfloat16* __restrict__ act, int hidden, int inter, int k, int first,
                        int local) {
  pdl_entry();
  __shared__ __align__(128) unsigned char raw[Smem<BM>::BYTES];
  __shared__ const __nv_bfloat16* ap[BM];
  __shared__ const __nv_bfloat16* bp[BN];
  const MoeTile tl = moe_tile_of(tiles, first, local);
  const int start = tl.start, n = tl.n, ex = tl.ex;
  if (!tl.live) return;  // uniform over the block
  const int j0 = blockIdx.x * 32;
  for (int i = threadIdx.x; i < BM + BN; i += blockDim.x) {
    if (i < BM) {
      ap[i] = x + (size_t)(order[start + min(i, n - 1)] / k) * hidden;
    } else {
      const int j = i - BM;  // 0..63: gate rows j0.. then up rows inter + j0..
      const size_t row = (size_t)ex * 2 * inter + (j < 32 ? j0 + j : inter + j0 + j - 32);
      bp[j] = gate_up_w + row * hidden;
    }
  }
  __syncthreads();
  tile_gemm<BM>(ap, bp, hidden, raw);
  const float* cs = reinterpret_cast<const float*>(raw);
  for (int i = threadIdx.x; i < n * 32; i += blockDim.x) {
    const int m = i / 32, j = i % 32;
    const float gv = to_f(from_f<__nv_bfloat16>(cs[m * LDC + j]));
    const float uv = to_f(from_f<__nv_bfloat16>(cs[m * LDC + 32 + j]));
    act[(size_t)(start + m) * inter + j0 + j] =
        from_f<__nv_bfloat16>(gv / (1.f + __expf(-gv)) * uv);
  }
}

// Grid (hidden / 64, tiles), 128 threads: block (bx, tile) computes output columns bx * 64..
// of the expert's down for the tile's pairs, rounded, times each pair's weight, rounded.
template <int BM>
__device__ void tc_down(const __nv_bfloat16* __restrict__ act, const __nv_bfloat16* __restrict__ down_w,
                     const uint32_t* __restrict__ order, const uint32_t* __restrict__ tiles,
                     const float* __restrict__ w, __nv_bfloat16* __restrict__ y, int hidden,
                     int inter, int first, int local) {
  pdl_entry();
  __shared__ __align__(128) unsigned char raw[Smem<BM>::BYTES];
  __shared__ const __nv_bfloat16* ap[BM];
  __shared__ const __nv_bfloat16* bp[BN];
  const MoeTile tl = moe_tile_of(tiles, first, local);
  const int start = tl.start, n = tl.n, ex = tl.ex;
  if (!tl.live) return;  // uniform over the block
  const int o0 = blockIdx.x * BN;
  for (int i = threadIdx.x; i < BM + BN; i += blockDim.x) {
    if (i < BM) ap[i] = act + (size_t)(start + min(i, n - 1)) * inter;
    else bp[i - BM] = down_w + ((size_t)ex * hidden + o0 + i - BM) * inter;
  }
  __syncthreads();
  tile_gemm<BM>(ap, bp, inter, raw);
  const float* cs = reinterpret_cast<const float*>(raw);
  for (int i = threadIdx.x; i < n * BN; i += blockDim.x) {
    const int m = i / BN, j = i % BN;
    const uint32_t pair = order[start + m];
    const float v = to_f(from_f<__nv_bfloat16>(cs[m * LDC + j]));
    y[(size_t)pair * hidden + o0 + j] = from_f<__nv_bfloat16>(v * w[pair]);
  }
}
}  // namespace mma_tile

#define MOE_MMA_KERNELS(BM)                                                                     \
  extern "C" __global__ void moe_gate_up_m##BM##_bf16(                                         \
      const __nv_bfloat16* x, const __nv_bfloat16* gate_up, const uint32_t* order,              \
      const uint32_t* tiles, __nv_bfloat16* act, int hidden, int inter, int k, int first,       \
      int local) {                                                                              \
    mma_tile::tc_gate_up<BM>(x, gate_up, order, tiles, act, hidden, inter, k, first, local);   \
  }                                                                                             \
  extern "C" __global__ void moe_down_m##BM##_bf16(                                            \
      const __nv_bfloat16* act, const __nv_bfloat16* down, const uint32_t* order,               \
      const uint32_t* tiles, const float* w, __nv_bfloat16* y, int hidden, int inter,           \
      int first, int local) {                                                                   \
    mma_tile::tc_down<BM>(act, down, order, tiles, w, y, hidden, inter, first, local);         \
  }
MOE_MMA_KERNELS(16)
MOE_MMA_KERNELS(64)

