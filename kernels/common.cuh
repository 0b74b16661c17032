// Device helpers every kernel file of `kernels/` shares (included, compiled into each fatbin).
#pragma once

#include <cuda_runtime.h>

namespace {

// Programmatic dependent launch (see src/engine/cuda/launch.rs): let the next kernel launch,
// then wait until the previous one finished and its writes are visible. First thing in every
// kernel, before any memory access; nothing on GPUs before sm_90.
__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Sum over a full warp (every lane gets the result).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace
