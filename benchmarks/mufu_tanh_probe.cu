// Probe (sm_90a): does a MUFU.TANH whose predicate is off cost special-function throughput? Build and run:
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/mufu_tanh_probe benchmarks/mufu_tanh_probe.cu && /tmp/mufu_tanh_probe
// (results: benchmarks/results/mufu_tanh_2026-12-02.md)
// Each kernel: per element  y = c * tanh(x * inv) ; then an ex2 like a softmax; inputs |x*inv| < 0.5.
#include <cstdio>
#include <cuda_runtime.h>
__device__ __forceinline__ float poly(float x) {
  const float x2 = x * x;
  return x * fmaf(x2, fmaf(x2, fmaf(x2, fmaf(x2, 0.021869488f, -0.053968254f), 0.13333334f), -0.33333334f), 1.f);
}
__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float th(float x) { float y; asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
template <int MODE>
__global__ void k(const float* in, float* out, float inv, int iters) {
  float r[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) r[i] = in[(blockIdx.x * 32 + i) * blockDim.x + threadIdx.x];
  float acc = 0.f;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      float x = r[i] * inv, t;
      if (MODE == 0) t = x;                       // plain: no tanh
      else if (MODE == 1) t = th(x);              // MUFU.TANH always
      else if (MODE == 2) t = fabsf(x) < 0.5f ? poly(x) : th(x);   // compiler predicates
      else if (MODE == 3) {                        // warp vote, uniform branch
        const bool small = fabsf(x) < 0.5f;
        t = poly(x);
        if (!__all_sync(0xffffffffu, small)) t = small ? t : th(x);
      } else t = poly(x);                          // polynomial only
      acc += ex2(fmaf(t, 30.f, -float(it & 7)));
      r[i] += 1e-7f;
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
int main() {
  const int blocks = 132 * 8, threads = 256, n = blocks * threads * 32, iters = 64;
  float *in, *out;
  cudaMalloc(&in, n * 4); cudaMalloc(&out, blocks * threads * 4);
  float* h = new float[n];
  for (int i = 0; i < n; ++i) h[i] = ((i * 2654435761u) % 2000) / 100.f - 10.f;  // scores in [-10, 10)
  cudaMemcpy(in, h, n * 4, cudaMemcpyHostToDevice);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  const char* names[] = {"plain (no tanh)", "MUFU.TANH", "select (predicated)", "vote branch", "poly only"};
  void (*ks[])(const float*, float*, float, int) = {k<0>, k<1>, k<2>, k<3>, k<4>};
  for (int m = 0; m < 5; ++m) {
    for (int w = 0; w < 3; ++w) ks[m]<<<blocks, threads>>>(in, out, 1.f / 30.f, iters);
    cudaEventRecord(a);
    for (int r = 0; r < 10; ++r) ks[m]<<<blocks, threads>>>(in, out, 1.f / 30.f, iters);
    cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b);
    printf("%-22s %8.3f ms  %6.1f G elem/s\n", names[m], ms / 10, double(n) * iters / (ms / 10 * 1e6));
  }
  return 0;
}
