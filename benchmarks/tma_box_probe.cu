// What a bulk tensor copy's box size and its issuing threads cost on Hopper: each CTA (one per SM) streams K tiles of
// 128 rows x 128 bf16 columns (32 KiB, the Hopper prefill's D 128 tile) into a four-stage shared-memory ring, as
// boxes of R rows x 64 columns from pages of R rows in random order (a page pool of 32768 keys x 8 heads, NHD),
// and a consumer warp releases each stage as soon as it has landed. Issue modes:
//   lanes: the tile's boxes from lanes 0 .. n-1 of warp 0 (the compiler issues a warp's copies lane by lane),
//   spread: box i from lane i / 4 of warp i % 4 (the prefill's dealing: paged_box_index),
//   one: thread 0 issues every box.
// Prints cycles per tile (mean over CTAs) and the aggregate bandwidth. Not part of the library or its tests.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I attngen/csrc -o tma_box_probe \
//     benchmarks/tma_box_probe.cu
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "hopper_tma.cuh"  // mbar_*, tma_load_4d, paged_box_index (attngen/csrc)

constexpr int kRows = 128, kCols = 128, kStages = 4, kHeads = 8, kKeys = 32768, kTiles = 256;
constexpr int kTileBytes = kRows * kCols * 2;

using namespace attngen;

// mode 0: lanes of warp 0; 1: spread over the four warps; 2: thread 0 issues all
template <int Mode>
__global__ void __launch_bounds__(160, 1)
    probe(const __grid_constant__ CUtensorMap map, const int* pages, int box_rows, long long* cycles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kTileBytes);
  uint64_t* empty = full + kStages;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 128), mbar_init(&empty[s], 1);
  }
  __syncthreads();
  const int head = blockIdx.x % kHeads, pages_per_tile = kRows / box_rows, boxes = pages_per_tile * 2;
  const int tiles_total = kKeys / kRows, first = (blockIdx.x / kHeads) * 16;
  if (warp < 4) {
    const int i = Mode == 1 ? paged_box_index(tid) : tid;
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % kStages, tile = (first + t) % tiles_total;
      int page = 0;  // (one: lane j of warp 0 holds page j, shuffled to thread 0 box by box)
      if (Mode != 2 && i < boxes) page = __ldg(pages + tile * pages_per_tile + i / 2);
      if (Mode == 2 && tid < pages_per_tile) page = __ldg(pages + tile * pages_per_tile + tid);
      if (t >= kStages) mbar_wait(&empty[s], ((t / kStages) - 1) & 1);
      unsigned char* dst = smem + s * kTileBytes;
      if (Mode == 2) {
        if (warp == 0) {
          if (tid == 0) mbar_expect_bytes(&full[s], kTileBytes);
          for (int b = 0; b < boxes; ++b) {
            const int p = __shfl_sync(0xffffffffu, page, b / 2), c = b % 2;
            if (tid == 0)
              tma_load_4d(dst + c * kRows * 128 + (b / 2) * box_rows * 128, &map, c * 64, head, 0, p, &full[s]);
          }
          if (tid != 0) mbar_arrive(&full[s]);
        } else {
          mbar_arrive(&full[s]);
        }
      } else if (i < boxes) {
        const int c = i % 2;
        mbar_expect_bytes(&full[s], uint32_t(box_rows * 128));
        tma_load_4d(dst + c * kRows * 128 + (i / 2) * box_rows * 128, &map, c * 64, head, 0, page, &full[s]);
      } else {
        mbar_arrive(&full[s]);
      }
    }
  } else if (lane == 0) {
    const long long t0 = clock64();
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % kStages;
      mbar_wait(&full[s], (t / kStages) & 1);
      mbar_arrive(&empty[s]);
    }
    cycles[blockIdx.x] = clock64() - t0;
  }
#endif
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t elems = size_t(kKeys) * kHeads * kCols;
  __nv_bfloat16* pool;
  cudaMalloc(&pool, elems * 2);
  cudaMemset(pool, 0, elems * 2);
  long long* cycles;
  cudaMalloc(&cycles, sms * sizeof(long long));
  int* pages;
  cudaMalloc(&pages, kKeys * sizeof(int));
  CUresult (*encode)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                     const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                     CUtensorMapL2promotion, CUtensorMapFloatOOBfill) = nullptr;
  cudaDriverEntryPointQueryResult found{};
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000,
                                   cudaEnableDefault, &found);
  if (encode == nullptr) {
    printf("no cuTensorMapEncodeTiled\n");
    return 1;
  }
  const size_t smem = kStages * kTileBytes + 2 * kStages * 8 + 1024;
  cudaFuncSetAttribute(probe<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  cudaFuncSetAttribute(probe<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  cudaFuncSetAttribute(probe<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  std::mt19937 rng(0);
  printf("| box rows | order | mode | cycles per tile | GB/s |\n|---|---|---|---|---|\n");
  for (int rows : {16, 32, 64, 128}) {
    for (int shuffled = 0; shuffled < 2; ++shuffled) {
      const int np = kKeys / rows;
      std::vector<int> perm(np);
      std::iota(perm.begin(), perm.end(), 0);
      if (shuffled) std::shuffle(perm.begin(), perm.end(), rng);
      cudaMemcpy(pages, perm.data(), np * sizeof(int), cudaMemcpyHostToDevice);
      CUtensorMap map;
      const cuuint64_t dims[4] = {kCols, kHeads, cuuint64_t(rows), cuuint64_t(np)};
      const cuuint64_t strides[3] = {kCols * 2, kHeads * kCols * 2, cuuint64_t(rows) * kHeads * kCols * 2};
      const cuuint32_t box[4] = {64, 1, cuuint32_t(rows), 1}, unit[4] = {1, 1, 1, 1};
      if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, pool, dims, strides, box, unit,
                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        printf("encode failed for %d rows\n", rows);
        return 1;
      }
      for (int mode = 0; mode < 3; ++mode) {
        auto kernel = mode == 0 ? probe<0> : mode == 1 ? probe<1> : probe<2>;
        float best = 1e30f;
        std::vector<long long> cyc(sms);
        for (int rep = 0; rep < 5; ++rep) {
          cudaEvent_t a, b;
          cudaEventCreate(&a), cudaEventCreate(&b);
          cudaEventRecord(a);
          kernel<<<sms, 160, smem>>>(map, pages, rows, cycles);
          cudaEventRecord(b);
          cudaEventSynchronize(b);
          float ms = 0;
          cudaEventElapsedTime(&ms, a, b);
          best = std::min(best, ms);
        }
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) {
          printf("error %s\n", cudaGetErrorString(err));
          return 1;
        }
        cudaMemcpy(cyc.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost);
        double mean = 0;
        for (long long c : cyc) mean += double(c) / kTiles / sms;
        const char* names[3] = {"lanes", "spread", "one"};
        printf("| %d | %s | %s | %.0f | %.0f |\n", rows, shuffled ? "random" : "in order", names[mode], mean,
               double(sms) * kTiles * kTileBytes / (best * 1e-3) / 1e9);
      }
    }
  }
  return 0;
}
