// Float helpers the device code shares and the host compiles too (tests/test_poly_exp2.py builds poly_exp2.h, which
// uses them, with g++): bit casts, a rounded FMA, and a max that keeps NaN.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ATTNGEN_HD __host__ __device__ __forceinline__
#else
#define ATTNGEN_HD inline
#endif

namespace attngen {

ATTNGEN_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

ATTNGEN_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

ATTNGEN_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// max(a, b) that returns NaN when either is NaN (fmaxf returns the other operand). The running max of the
// decode templates' online softmax goes through it, so that a NaN score poisons the row even when it comes
// while the max is still -inf (where the weight of a -inf max is forced to 0); poly_exp2.h clamps with it. On
// sm_80+ it is one max.NaN.f32, the same cost as fmaxf; before, two compares more.
ATTNGEN_HD float fmax_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float y;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
#elif defined(__CUDA_ARCH__)
  return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#else
  return (a != a || b != b) ? bits_float(0x7fffffffu) : std::fmax(a, b);
#endif
}

}  // namespace attngen
