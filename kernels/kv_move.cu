// Whole KV blocks between the paged caches and a block-major staging buffer: the moves of the
// KV tiers below the GPU (launcher: src/engine/model/kv_pinned.rs). `caches` is a device array
// of the 2 * layers cache tensors (K then V of layer 0, then layer 1, ...), each head-major
// [kv_heads, num_slots, head_dim]; a block's rows of one head are row_units 16-byte units at
// unit (head * head_pitch + block * row_units). `staged` is [n, parts, kv_heads, row_units]:
// block j of the move is cache block ids.b[j] (the ids come by value, at most 64: nothing is
// uploaded for them, so queueing a move never waits for the device). Grid (n, parts,
// kv_heads), 128 threads: one row each. Launched without programmatic dependent launch: it starts after everything before
// it on the stream and everything after it starts after it.
#include <stdint.h>

struct KvIds {
  uint32_t b[64];
};

extern "C" __global__ void kv_gather(const uint4* const* __restrict__ caches,
                                     const KvIds ids,
                                     uint4* __restrict__ staged, int parts, int heads,
                                     int row_units, long long head_pitch) {
  const int j = blockIdx.x, i = blockIdx.y, h = blockIdx.z;
  const uint4* src = caches[i] + h * head_pitch + (long long)ids.b[j] * row_units;
  uint4* dst = staged + (((long long)j * parts + i) * heads + h) * row_units;
  for (int u = threadIdx.x; u < row_units; u += blockDim.x) dst[u] = src[u];
}

extern "C" __global__ void kv_scatter(uint4* const* __restrict__ caches,
                                      const KvIds ids,
                                      const uint4* __restrict__ staged, int parts, int heads,
                                      int row_units, long long head_pitch) {
  const int j = blockIdx.x, i = blockIdx.y, h = blockIdx.z;
  uint4* dst = caches[i] + h * head_pitch + (long long)ids.b[j] * row_units;
  const uint4* src = staged + (((long long)j * parts + i) * heads + h) * row_units;
  for (int u = threadIdx.x; u < row_units; u += blockDim.x) dst[u] = src[u];
}

// The host tier's loads without staging (LaunchOptions / KernelOptions::kv_load_direct): block j
// of the move is read straight from its pinned host slot src.p[j] (laid out as one block of
// `staged`: [parts, kv_heads, row_units]; pinned memory is mapped at the same address on the
// device under unified addressing) over PCIe, and written to cache block ids.b[j]. Same grid.
struct KvSrcs {
  const uint4* p[64];
};

extern "C" __global__ void kv_scatter_host(uint4* const* __restrict__ caches, const KvIds ids,
                                           const KvSrcs srcs, int parts, int heads,
                                           int row_units, long long head_pitch) {
  const int j = blockIdx.x, i = blockIdx.y, h = blockIdx.z;
  uint4* dst = caches[i] + h * head_pitch + (long long)ids.b[j] * row_units;
  const uint4* src = srcs.p[j] + ((long long)i * heads + h) * row_units;
  for (int u = threadIdx.x; u < row_units; u += blockDim.x) dst[u] = src[u];
}
