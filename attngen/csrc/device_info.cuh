// Host-side facts about the current CUDA device that the launchers need, queried once per device.
#pragma once
#include <cuda_runtime.h>

namespace attngen {

// Opt-in shared memory per block of the current device (the launchers pick tile configurations by it;
// the value depends only on the device, so it is not re-queried on every launch, i.e. every layer).
inline int device_smem_optin() {
  static int optin_by_device[64] = {0};
  int dev = 0;
  cudaGetDevice(&dev);
  int& optin = optin_by_device[dev & 63];
  if (optin == 0) cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  return optin;
}

}  // namespace attngen
