// Host-side facts about the current CUDA device that the launchers need, queried once per device.
#pragma once
#include <cuda_runtime.h>

// The least opt-in shared memory per block of every GPU the build's archs run on (bytes; the build defines
// it for arch-specific targets, schedules/arch.py smem_optin_floor; 0: unknown). A launcher's tile
// configuration that fits it is always picked, and its smaller fallbacks are not compiled at all.
#ifndef ATTNGEN_SMEM_OPTIN_FLOOR
#define ATTNGEN_SMEM_OPTIN_FLOOR 0
#endif

namespace attngen {

constexpr size_t kSmemOptinFloor = ATTNGEN_SMEM_OPTIN_FLOOR;

// An attribute of the current device, queried once per device and attribute (the launchers read these
// on every launch, i.e. every layer; they depend only on the device).
template <cudaDeviceAttr A>
inline int cached_device_attribute() {
  static int value_by_device[64] = {0};
  int dev = 0;
  cudaGetDevice(&dev);
  int& value = value_by_device[dev & 63];
  if (value == 0) cudaDeviceGetAttribute(&value, A, dev);
  return value;
}

// Opt-in shared memory per block (the launchers pick tile configurations by it).
inline int device_smem_optin() { return cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(); }

// Compute capability major.
inline int device_cc_major() { return cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(); }

// Streaming multiprocessors.
inline int device_sm_count() { return cached_device_attribute<cudaDevAttrMultiProcessorCount>(); }

// A float scratch buffer of at least `floats` elements on the current device, kept for later
// calls; growing it frees the old one (cudaFree waits for the device), so it stops growing once
// the largest batch has been seen. For callers with no workspace argument (TVM's slot calls).
inline float* device_scratch(size_t floats) {
  static float* buf_by_device[64] = {nullptr};
  static size_t size_by_device[64] = {0};
  int dev = 0;
  cudaGetDevice(&dev);
  if (size_by_device[dev & 63] < floats) {
    if (buf_by_device[dev & 63]) cudaFree(buf_by_device[dev & 63]);
    buf_by_device[dev & 63] = nullptr;
    size_by_device[dev & 63] = 0;
    if (cudaMalloc(&buf_by_device[dev & 63], floats * sizeof(float)) == cudaSuccess) size_by_device[dev & 63] = floats;
  }
  return buf_by_device[dev & 63];
}

// Even split-KV chunks when the key lengths are not known on the host: as many chunks of each (request, KV
// head) as fill the device's resident CTA slots (ctas_per_sm x SMs; twice the SMs where it is unknown) once,
// at most 16. One wave of equal chunks: a rounded-up count would start a second, partial wave that leaves
// SMs idle while it runs (B 32 x 8 KV heads in the H200's 264 slots made two chunks per request, 1.94 waves).
inline int even_decode_chunks(int batch, int num_kv_heads, int ctas_per_sm) {
  const int ctas = batch * num_kv_heads;
  const int slots = (ctas_per_sm > 0 ? ctas_per_sm : 2) * device_sm_count();
  const int chunks = ctas > 0 ? slots / ctas : 1;
  return chunks < 1 ? 1 : (chunks < 16 ? chunks : 16);
}

}  // namespace attngen
