// Host-side glue between TVM-FFI arguments and the CUDA templates: data pointers
// (byte offsets honoured), the caller's current stream, light argument checks.
#pragma once
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

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
    TVM_FFI_THROW(ValueError) << name << ": expected " << ndim << " dims, got " << t.ndim();
  if (t.device().device_type != kDLCUDA)
    TVM_FFI_THROW(ValueError) << name << ": expected a CUDA tensor";
  if (t.dtype().bits != bits.bits)
    TVM_FFI_THROW(ValueError) << name << ": expected a " << int(bits.bits) << "-bit element type";
}

inline void check_launch(const char* name) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) TVM_FFI_THROW(RuntimeError) << name << ": CUDA launch failed: " << cudaGetErrorString(err);
}

}  // namespace attngen
