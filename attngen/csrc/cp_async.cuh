// 16-byte global->shared copies: cp.async with zero fill on sm_80+, a plain copy on sm_75.
#pragma once
#include <stdint.h>

namespace attngen {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// To a shared-memory address; !valid: fill the 16 bytes with zeros, read nothing. L2::128B: the L2 fetches
// the whole 128-byte line the chunk lies in (a K/V row's neighbouring chunks are copied by the neighbouring
// threads).
__device__ __forceinline__ void copy16_async_to(uint32_t dst, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}
#endif

__device__ __forceinline__ void copy16_async(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  copy16_async_to(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), gmem, valid);
#else
  *reinterpret_cast<uint4*>(smem) = valid ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}

__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

}  // namespace attngen
