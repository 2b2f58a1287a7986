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

// An fp8 entry's k_scale / v_scale [Hkv] float32 (types checked by the entry), one entry per KV head.
inline KVScales kv_scales_of(const char* name, const tvm::ffi::TensorView& k_scale,
                             const tvm::ffi::TensorView& v_scale, int num_kv_heads) {
  if (k_scale.size(0) != num_kv_heads || v_scale.size(0) != num_kv_heads)
    ATTNGEN_THROW(ValueError) << name << ": k_scale / v_scale need one entry per KV head (" << num_kv_heads << ")";
  return KVScales{static_cast<const float*>(data_of(k_scale)), static_cast<const float*>(data_of(v_scale))};
}

}  // namespace attngen
