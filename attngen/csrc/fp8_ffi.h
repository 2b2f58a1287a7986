// The DLPack element types of the fp8 K/V formats (fp8_kv.cuh) for the fp8 entries' argument checks
// (entry_decode_fp8.h, entry_prefill_fp8.h): torch's float8_e4m3fn / float8_e5m2.
#pragma once
#include <cuda_fp8.h>

#include "ffi_glue.h"
#include "fp8_kv.cuh"

namespace attngen {

template <>
constexpr DLDataType dl_dtype<__nv_fp8_e4m3>() { return {static_cast<uint8_t>(kDLFloat8_e4m3fn), 8, 1}; }
template <>
constexpr DLDataType dl_dtype<__nv_fp8_e5m2>() { return {static_cast<uint8_t>(kDLFloat8_e5m2), 8, 1}; }

// An fp8 entry's k_scale / v_scale float32 (types checked by the entry), each [Hkv] (one per KV head) or [1] (one
// for the whole cache).
inline KVScales kv_scales_of(const char* name, const tvm::ffi::TensorView& k_scale,
                             const tvm::ffi::TensorView& v_scale, int num_kv_heads) {
  const auto fits = [&](const tvm::ffi::TensorView& s) { return s.size(0) == num_kv_heads || s.size(0) == 1; };
  if (!fits(k_scale) || !fits(v_scale))
    ATTNGEN_THROW(ValueError) << name << ": k_scale / v_scale need one entry per KV head (" << num_kv_heads
                              << ") or one for the cache; got " << k_scale.size(0) << " and " << v_scale.size(0);
  for (const auto* s : {&k_scale, &v_scale})  // (the kernels read entry h at h: a strided view would be misread)
    if (s->size(0) > 1 && s->stride(0) != 1)
      ATTNGEN_THROW(ValueError) << name << ": k_scale / v_scale must be contiguous (stride " << s->stride(0)
                                << "); pass .contiguous()";
  return KVScales{static_cast<const float*>(data_of(k_scale)), static_cast<const float*>(data_of(v_scale)),
                  k_scale.size(0) == 1 ? 0 : -1, v_scale.size(0) == 1 ? 0 : -1};
}

}  // namespace attngen
