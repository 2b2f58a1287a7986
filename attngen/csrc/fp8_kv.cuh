// fp8 K/V caches on CUDA (float8_e4m3fn -> __nv_fp8_e4m3, float8_e5m2 -> __nv_fp8_e5m2): elements are
// dequantised on load to float, on every arch (sm_89+ convert in hardware, earlier archs in a few integer
// instructions through cuda_fp8.h); no fp8 tensor-core path. A stored key stands for k * k_scale[head],
// a value for v * v_scale[head] (attngen/runtime/fp8.py): templates fold k_scale into the query's scale
// (or apply it before a key hook) and v_scale into the output row, so the hot loop adds no multiply.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>

namespace attngen {

template <class KV>
inline constexpr bool kIsFp8 = std::is_same_v<KV, __nv_fp8_e4m3> || std::is_same_v<KV, __nv_fp8_e5m2>;

// Elements of one 16-byte copy (cp.async's largest) of K/V rows of KV
template <class KV>
inline constexpr int kElemsPer16B = int(16 / sizeof(KV));

// 8 fp8 elements (8 bytes) -> float[8], exactly (every fp8 value is a half value)
template <class KV>
__device__ __forceinline__ void convert8_fp8(const uint2& raw, float (&out)[8]) {
  static_assert(kIsFp8<KV>, "convert8_fp8 reads fp8 elements");
  constexpr __nv_fp8_interpretation_t kKind = std::is_same_v<KV, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
  const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[i], kKind)));
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Overloads of common.cuh's load8_shared for fp8 tiles: the templates' call sites read K/V tiles of any
// element type alike
__device__ __forceinline__ void load8_shared(const __nv_fp8_e4m3* ptr, float (&out)[8]) {
  convert8_fp8<__nv_fp8_e4m3>(*reinterpret_cast<const uint2*>(ptr), out);
}
__device__ __forceinline__ void load8_shared(const __nv_fp8_e5m2* ptr, float (&out)[8]) {
  convert8_fp8<__nv_fp8_e5m2>(*reinterpret_cast<const uint2*>(ptr), out);
}

// 8 fp8 elements (8 bytes) -> 8 elements of the 16-bit type T (16 bytes), exactly: half pairs straight from
// the conversion, bfloat16 pairs through float (every fp8 value is a bfloat16 value too)
template <class T, class KV>
__device__ __forceinline__ uint4 widen8_fp8(const uint2& raw) {
  static_assert(kIsFp8<KV>, "widen8_fp8 reads fp8 elements");
  constexpr __nv_fp8_interpretation_t kKind = std::is_same_v<KV, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
  const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
  uint4 out;
  uint32_t* w = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2 h(__nv_cvt_fp8x2_to_halfraw2(pairs[i], kKind));
    if constexpr (std::is_same_v<T, half>) {
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(h));
      w[i] = *reinterpret_cast<const uint32_t*>(&b);
    }
  }
  return out;
}

// Two fp8 elements (the low 16 bits of pair) -> a half2's bits (low half: the first element), exactly
template <class KV>
__device__ __forceinline__ uint32_t fp8x2_to_half2_bits(uint32_t pair) {
  static_assert(kIsFp8<KV>, "fp8x2_to_half2_bits reads fp8 elements");
  constexpr __nv_fp8_interpretation_t kKind = std::is_same_v<KV, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), kKind);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// The scales of an fp8 cache, float32 on the device: [Hkv] (one per KV head) or [1] (one for the cache, which
// every head reads: mask 0), so that a serving runtime's one-entry scale tensor reaches the kernels as it is, with
// no expanding copy per call
struct KVScales {
  const float* k = nullptr;
  const float* v = nullptr;
  int k_mask = -1, v_mask = -1;  // -1: [Hkv]; 0: [1]
  __device__ __forceinline__ float k_of(int hk) const { return k[hk & k_mask]; }
  __device__ __forceinline__ float v_of(int hk) const { return v[hk & v_mask]; }
};

}  // namespace attngen
