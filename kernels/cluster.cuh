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

}  // namespace
