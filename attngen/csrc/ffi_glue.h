// Host-side glue between TVM-FFI arguments and the CUDA templates: data pointers
// (byte offsets honoured), the caller's current stream, argument checks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <cstdint>
#include <initializer_list>

#include "ffi_export.h"
#include "host_error.h"

namespace attngen {

inline void* data_of(const tvm::ffi::TensorView& t) {
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}

inline cudaStream_t stream_of(const tvm::ffi::TensorView& t) {
  DLDevice dev = t.device();
  cudaSetDevice(dev.device_id);
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(dev.device_type, dev.device_id));
}

inline void check_tensor(const tvm::ffi::TensorView& t, const char* name, int ndim, DLDataType bits) {
  if (t.ndim() != ndim)
    ATTNGEN_THROW(ValueError) << name << ": expected " << ndim << " dims, got " << t.ndim();
  if (t.device().device_type != kDLCUDA)
    ATTNGEN_THROW(ValueError) << name << ": expected a CUDA tensor";
  if (t.dtype().bits != bits.bits)
    ATTNGEN_THROW(ValueError) << name << ": expected a " << int(bits.bits) << "-bit element type";
}

// The DLPack element type of a C++ element type the templates are instantiated with.
template <class T>
constexpr DLDataType dl_dtype();
template <>
constexpr DLDataType dl_dtype<half>() { return {kDLFloat, 16, 1}; }
template <>
constexpr DLDataType dl_dtype<__nv_bfloat16>() { return {kDLBfloat, 16, 1}; }
template <>
constexpr DLDataType dl_dtype<float>() { return {kDLFloat, 32, 1}; }
template <>
constexpr DLDataType dl_dtype<int32_t>() { return {kDLInt, 32, 1}; }
template <>
constexpr DLDataType dl_dtype<int64_t>() { return {kDLInt, 64, 1}; }
template <>
constexpr DLDataType dl_dtype<unsigned char>() { return {kDLUInt, 8, 1}; }

// A tensor argument of an exported entry function and what it must be (ndim < 0: any rank).
struct TensorArg {
  const char* name;
  const tvm::ffi::TensorView& tensor;
  int ndim;
  DLDataType dtype;
};

// The exact element type and the rank of every argument (and a compact layout for integer ones: index arrays,
// maps and orders are read at element offsets, while floating-point data carry their strides), then their
// devices, all on one GPU: `device_id` (the call's, for a list checked apart from q), or the first one's when
// it is -1. Each refusal names the function and the argument: a caller without a GPU learns of every wrong
// type first.
inline void check_args(const char* entry, std::initializer_list<TensorArg> args, int device_id = -1) {
  for (const TensorArg& a : args) {
    if (a.tensor.dtype() != a.dtype)
      ATTNGEN_THROW(TypeError) << entry << ": " << a.name << ": expected element type " << a.dtype << ", got "
                               << a.tensor.dtype();
    if (a.ndim >= 0 && a.tensor.ndim() != a.ndim)
      ATTNGEN_THROW(ValueError) << entry << ": " << a.name << ": expected " << a.ndim << " dims, got "
                                << a.tensor.ndim();
    if ((a.dtype.code == kDLInt || a.dtype.code == kDLUInt) && !a.tensor.IsContiguous())
      ATTNGEN_THROW(ValueError) << entry << ": " << a.name << ": must be contiguous (an index array is read at "
                                << "element offsets)";
  }
  for (const TensorArg& a : args) {
    if (a.tensor.device().device_type != kDLCUDA)
      ATTNGEN_THROW(ValueError) << entry << ": " << a.name << ": expected a CUDA tensor";
    const int want = device_id >= 0 ? device_id : args.begin()->tensor.device().device_id;
    if (a.tensor.device().device_id != want)
      ATTNGEN_THROW(ValueError) << entry << ": " << a.name << ": on cuda:" << a.tensor.device().device_id
                                << ", the call's tensors on cuda:" << want << " (one call runs on one GPU)";
  }
}

inline void check_launch(const char* name) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaErrorCooperativeLaunchTooLarge)
    ATTNGEN_THROW(RuntimeError) << name << ": the plan's tail split needs one CTA on every SM at once, and the device "
                                << "cannot hold them now (a share of the GPU under MPS or a green context): plan with "
                                << "tail_split=False";
  if (err != cudaSuccess) ATTNGEN_THROW(RuntimeError) << name << ": CUDA launch failed: " << cudaGetErrorString(err);
}

}  // namespace attngen
