// sm_90a building blocks of the Hopper templates: mbarriers (the producer / consumer pipeline),
// named barriers (one warpgroup at a time), the generic-to-async proxy fence, register reallocation,
// the wgmma fence / commit / wait protocol and shared-memory matrix descriptors.
//
// Shared-memory tiles of the Hopper templates use the 128-byte swizzle: a tile of R rows x D 16-bit
// elements is stored as D / 64 column blocks of R rows x 128 bytes; within each 1024-byte group of 8 rows,
// row r's 16-byte chunk c sits at chunk c ^ (r % 8) (sw128_offset). The same bytes serve as a K-major
// operand (S = Q K^T: rows are M or N, the 64 columns K) and as an MN-major one (O += P V: V's rows are
// K, its columns N), so K and V tiles are written the same way.
#pragma once
#include <stdint.h>

#include "mma.cuh"  // smem_addr

namespace attngen {

// Byte offset of element (r, i) of a 128-byte-swizzled tile of `rows` rows (rows % 8 == 0).
__device__ __forceinline__ uint32_t sw128_offset(int r, int i, int rows) {
  return uint32_t((i / 64) * rows * 128 + r * 128 + ((((i % 64) / 8) ^ (r % 8)) << 4) + (i % 8) * 2);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// ---- mbarriers -----------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Waits until the phase with parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// ---- named barriers (id 1..15; 0 is __syncthreads) ------------------------------------------
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Ordinary shared-memory writes (stores, cp.async) become visible to the async proxy (wgmma) only after
// this fence in the writing thread, before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- register reallocation between warpgroups ------------------------------------------------
template <int N>
__device__ __forceinline__ void regs_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int N>
__device__ __forceinline__ void regs_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- wgmma protocol --------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving register reads / writes of an accumulator across the asynchronous
// MMAs that own it (between a wgmma and its wait the registers belong to the tensor cores).
template <int N>
__device__ __forceinline__ void pin_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ---- shared-memory matrix descriptors (128-byte swizzle) --------------------------------------
// K-major operand: 8-row groups 1024 bytes apart (SBO), the leading offset unused (1); `addr` may point
// inside a 128-byte row (k-steps of 16 elements advance it by 32 bytes).
__host__ __device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// MN-major operand: 64-element column blocks `block_bytes` apart (LBO), 8-row groups (of K) 1024 bytes
// apart (SBO).
__host__ __device__ __forceinline__ uint64_t desc_mn_major(uint32_t addr, uint32_t block_bytes) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(block_bytes >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// The descriptor of the operand `bytes` (a multiple of 16) past the one `desc` describes: the address field
// (bits 0-13, the address over 16) advances by bytes / 16 with no carry out of it (a CTA's shared memory lies
// below 2^18 bytes, so the field stays below 2^14), one add of the low word: a loop of wgmmas over one operand
// forms each descriptor with one uniform add instead of masking, shifting and or-ing its address again.
__host__ __device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(desc) + (bytes >> 4));
}

}  // namespace attngen
