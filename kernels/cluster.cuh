// Thread-block cluster helpers (sm_90; on older GPUs they compile to nothing, and the
// kernels that use them are launched without clusters there): the fused decode attention's
// merge (`fused_decode.cu`) and the split tensor-core matmuls (`gemv_mma.cu`).
#pragma once

#include <cooperative_groups.h>

namespace {

// Blocks in this block's cluster and its rank there (1 and 0 without clusters).
__device__ __forceinline__ int cluster_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return (int)cooperative_groups::this_cluster().num_blocks();
#else
  return 1;
#endif
}

// Cluster barrier halves (sm_90; every thread of every block that has not exited takes
// part): arrive (release: this thread's earlier writes, shared memory of other blocks
// included, are visible to whoever waits after it), and wait (for every thread of the cluster
// that has not exited to have arrived).
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// Block `rank`'s shared-memory address of p (a variable of this kernel's shared memory).
template <typename V>
__device__ __forceinline__ V* cluster_peer(V* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  return p;
#endif
}

// The push of partials into block 0's shared memory by st.async (`fused_decode.cu`): each
// store signals block 0's mbarrier with its bytes, so block 0 waits on its own barrier instead
// of a cluster barrier whose release fences every thread's memory at GPU scope. A peer exits
// once its stores are issued: they carry their values, and block 0, whose memory they land
// in, stays until its barrier has counted them all. `push_bar_init`: by one thread of block 0
// before the cluster's first barrier (which makes the initialisation visible to the cluster),
// expecting `bytes` in all.
__device__ __forceinline__ void push_bar_init(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes)
               : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// The shared::cluster address of block `rank`'s copy of p (a variable of this kernel's shared
// memory).
__device__ __forceinline__ uint32_t cluster_addr(const void* p, int rank) {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(r)
               : "r"((uint32_t)__cvta_generic_to_shared(p)), "r"(rank));
#endif
  return r;
}

// One float into another block's shared memory (`addr`, from cluster_addr), its 4 bytes
// counted on that block's mbarrier `bar` (also from cluster_addr).
__device__ __forceinline__ void push_f32(uint32_t addr, float v, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(
                   addr),
               "r"(__float_as_uint(v)), "r"(bar)
               : "memory");
#endif
}

// Waits until this block's push barrier has counted every byte it expects (its first phase).
__device__ __forceinline__ void push_bar_wait(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], "
        "0;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(a)
        : "memory");
  }
#endif
}

}  // namespace
