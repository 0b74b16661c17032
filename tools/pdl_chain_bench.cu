// What a kernel boundary costs in a chain of launches, by how the next kernel waits for the
// one before: a CUDA graph of K tiny kernels of G blocks each (every block reads 256 values
// the kernel before wrote and writes 256 for the next), replayed back to back; us a kernel.
//
//   plain:   no programmatic dependent launch (stream order).
//   pdl:     PDL; each kernel triggers its dependents at its start and waits
//            (griddepcontrol.wait) before reading (the engine's chain today).
//   count:   PDL; each block of a kernel, once its values are stored, adds one to that
//            launch's counter (release); the next kernel's blocks spin until the counter
//            reaches the blocks of the kernel before (acquire), read, and wait
//            (griddepcontrol.wait) only at their end, so the chain still completes in order.
//
// Build: nvcc -O3 -std=c++17 -arch=sm_90 tools/pdl_chain_bench.cu -o pdl_chain_bench
// Run:   ./pdl_chain_bench            (prints a table)
// Not part of the crate: a measurement of the hardware, for BENCHMARKS.md (#21, #29).
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t ck_e = (x);                                                         \
    if (ck_e != cudaSuccess) {                                                    \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(ck_e)); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release(unsigned* p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}

// MODE 0 plain, 1 pdl, 2 count. in/out: [G * 256] floats (the kernel before's, this one's).
// cnt_prev: the kernel before's counter (its blocks), cnt: this one's. spin: 0 busy, 1 nanosleep.
template <int MODE>
__global__ void __launch_bounds__(256) link(const float* in, float* out, const unsigned* cnt_prev,
                                            unsigned prev_blocks, unsigned* cnt, int work) {
  if (MODE >= 1) asm volatile("griddepcontrol.launch_dependents;");
  if (MODE == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (MODE == 2) {
    if (threadIdx.x == 0 && cnt_prev != nullptr) {
      while (ld_acquire(cnt_prev) < prev_blocks) {
      }
    }
    __syncthreads();
  }
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  // Read a value of another block of the kernel before (so every block depends on the
  // previous kernel's other blocks, as a matmul's input row does).
  const int n = gridDim.x * blockDim.x;
  float v = __ldcg(&in[(i * 97 + 13) % n]);
  for (int k = 0; k < work; ++k) v = v * 0.999f + 1.f;
  out[i] = v;
  if (MODE == 2) {
    __syncthreads();
    if (threadIdx.x == 0) red_release(cnt);
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
}

template <int MODE>
static void launch(cudaStream_t s, int G, const float* in, float* out, const unsigned* cp,
                   unsigned pb, unsigned* c, int work) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(G);
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = MODE >= 1 ? 1 : 0;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, link<MODE>, in, out, cp, pb, c, work));
}

// us a kernel for a chain of K kernels of G blocks (graph replayed R times).
static double chain(int mode, int K, int G, int work, int R) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *a, *b;
  unsigned* cnt;
  CK(cudaMalloc(&a, sizeof(float) * G * 256));
  CK(cudaMalloc(&b, sizeof(float) * G * 256));
  CK(cudaMalloc(&cnt, sizeof(unsigned) * (K + 1)));
  CK(cudaMemset(a, 0, sizeof(float) * G * 256));
  CK(cudaMemset(b, 0, sizeof(float) * G * 256));
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CK(cudaMemsetAsync(cnt, 0, sizeof(unsigned) * (K + 1), s));
  for (int k = 0; k < K; ++k) {
    const float* in = (k & 1) ? b : a;
    float* out = (k & 1) ? a : b;
    const unsigned* cp = k == 0 ? nullptr : cnt + k - 1;
    if (mode == 0) launch<0>(s, G, in, out, cp, G, cnt + k, work);
    if (mode == 1) launch<1>(s, G, in, out, cp, G, cnt + k, work);
    if (mode == 2) launch<2>(s, G, in, out, cp, G, cnt + k, work);
  }
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, s));
  for (int i = 0; i < R; ++i) CK(cudaGraphLaunch(ge, s));
  CK(cudaEventRecord(e1, s));
  CK(cudaStreamSynchronize(s));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(cnt));
  CK(cudaStreamDestroy(s));
  return ms * 1e3 / R / K;
}

// A decode step's copies around its graph: a graph of K tiny PDL kernels (G blocks), replayed R
// times back to back, and with a step's copies on the stream around each replay: `h2d` bytes
// from pinned memory into the graph's input, 32 bytes device to device, 32 bytes back to
// pinned memory, and the same with the device-to-device copy as a kernel inside the graph, and
// with the read-back on a second stream (waiting on an event after the graph). us a step.
__global__ void copy_ids(const unsigned* src, unsigned* dst, int n) {
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x < n) dst[threadIdx.x] = src[threadIdx.x];
}

static void steps(int K, int G, int R, size_t h2d) {
  cudaStream_t s, side;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  float *a, *b;
  unsigned *cnt, *in, *ids, *hin, *hout;
  CK(cudaMalloc(&a, sizeof(float) * G * 256));
  CK(cudaMalloc(&b, sizeof(float) * G * 256));
  CK(cudaMalloc(&cnt, sizeof(unsigned) * (K + 1)));
  CK(cudaMalloc(&in, h2d + 64));
  CK(cudaMalloc(&ids, 64));
  CK(cudaMemset(a, 0, sizeof(float) * G * 256));
  CK(cudaMemset(b, 0, sizeof(float) * G * 256));
  CK(cudaMemset(ids, 0, 64));
  CK(cudaHostAlloc(&hin, h2d + 64, 0));
  CK(cudaHostAlloc(&hout, 64, 0));
  cudaGraphExec_t ge[2];
  for (int with_copy = 0; with_copy < 2; ++with_copy) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    if (with_copy) copy_ids<<<1, 32, 0, s>>>(ids, in, 8);
    for (int k = 0; k < K; ++k) {
      const float* i0 = (k & 1) ? b : a;
      float* o0 = (k & 1) ? a : b;
      launch<1>(s, G, i0, o0, nullptr, G, cnt + k, 0);
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge[with_copy], g, 0));
    CK(cudaGraphDestroy(g));
  }
  cudaEvent_t e0, e1, done[4];
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (auto& e : done) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const char* names[] = {"graph alone", "+ h2d", "+ h2d + d2d", "+ h2d + d2d + d2h (today)",
                         "+ h2d, d2d in the graph, d2h", "+ h2d, d2d in the graph, d2h on a side stream",
                         "d2d in the graph, d2h on a side stream (no h2d)"};
  for (int m = 0; m < 7; ++m) {
    double best = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      for (int i = 0; i < R + 3; ++i) {
        if (i == 3) CK(cudaEventRecord(e0, s));
        const bool up = m >= 1 && m <= 5;
        if (up) CK(cudaMemcpyAsync(in, hin, h2d, cudaMemcpyHostToDevice, s));
        if (m == 2 || m == 3) CK(cudaMemcpyAsync(in, ids, 32, cudaMemcpyDeviceToDevice, s));
        CK(cudaGraphLaunch(ge[m >= 4 ? 1 : 0], s));
        if (m == 3 || m == 4) CK(cudaMemcpyAsync(hout, ids, 32, cudaMemcpyDeviceToHost, s));
        if (m >= 5) {
          cudaEvent_t e = done[i % 4];
          CK(cudaEventRecord(e, s));
          CK(cudaStreamWaitEvent(side, e, 0));
          CK(cudaMemcpyAsync(hout, ids, 32, cudaMemcpyDeviceToHost, side));
        }
      }
      CK(cudaEventRecord(e1, s));
      CK(cudaStreamSynchronize(s));
      CK(cudaStreamSynchronize(side));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      best = ms * 1e3 / R < best ? ms * 1e3 / R : best;
    }
    printf("| %s | %zu | %.1f |\n", names[m], h2d, best);
  }
  for (auto& g : ge) CK(cudaGraphExecDestroy(g));
  CK(cudaFreeHost(hin));
  CK(cudaFreeHost(hout));
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(cnt));
  CK(cudaFree(in));
  CK(cudaFree(ids));
  CK(cudaStreamDestroy(s));
  CK(cudaStreamDestroy(side));
}

int main(int argc, char** argv) {
  if (argc > 1 && argv[1][0] == 's') {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("# a step: a graph of 280 PDL kernels of %d blocks, 200 steps; us a step\n", sms);
    printf("| stream | bytes up | us a step |\n|---|---|---|\n");
    steps(280, sms, 200, 4096);
    steps(280, sms, 200, 64 * 1024);
    return 0;
  }
  const int K = argc > 1 ? atoi(argv[1]) : 280;
  const int R = argc > 2 ? atoi(argv[2]) : 40;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("# %s, %d SMs; a chain of %d kernels, graph replayed %d times; us a kernel\n", p.name,
         sms, K, R);
  printf("| blocks | work | plain | pdl | count | pdl - count |\n|---|---|---|---|---|---|\n");
  const int grids[] = {1, 16, sms, 2 * sms, 4 * sms, 6 * sms};
  const int works[] = {0, 2000};
  for (int work : works)
    for (int G : grids) {
      double t[3];
      for (int m = 0; m < 3; ++m) t[m] = chain(m, K, G, work, R);
      // Again, interleaved, for noise.
      double u[3];
      for (int m = 0; m < 3; ++m) u[m] = chain(m, K, G, work, R);
      for (int m = 0; m < 3; ++m) t[m] = t[m] < u[m] ? t[m] : u[m];
      printf("| %d | %d | %.2f | %.2f | %.2f | %.2f |\n", G, work, t[0], t[1], t[2], t[1] - t[2]);
    }
  return 0;
}
