// Kernels of a linked cubin, by name, for the host glue of link-time builds (codegen/lto.py).
//
// The variant's library embeds its cubins (one per template object and arch, linked in parallel: the
// parts) and a table from each kernel's key, e.g. "decode_kernel<__half, 128, 4>" (its template arguments
// after the traits, as c++filt prints them), to its mangled name and part. Each part's cubin loads once
// per process and device, when a kernel of it is first looked up (cudaLibraryLoadData, context-independent); a
// kernel is then a cudaKernel_t, which the runtime API accepts wherever a __global__ function's
// address goes (launch, attributes, occupancy), so the launchers run unchanged on it.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>

extern "C" {
// Defined by the variant's generated link object: the cubins with the arch (major * 10 + minor) and the
// part each is for, the key -> mangled-name pairs, and each pair's part; the lists end with a null entry
// (the parts with -1).
struct AttngenLinkedCubin {
  const unsigned char* data;
  int sm;
  int part;
};
extern const AttngenLinkedCubin attngen_linked_cubins[];
extern const char* const attngen_linked_kernels[];
extern const int attngen_linked_kernel_parts[];
// Cubins of parts linked on first use (codegen/lto.py link_deferred), registered at run time by the exports'
// attngen_register_linked_cubin (csrc/linked_register.h); entries below attngen_extra_count never change.
struct AttngenExtraCubin {
  const unsigned char* data;
  int sm;
  int num_kernels;
  const char* const* kernels;  // key, mangled name, ...
};
extern AttngenExtraCubin attngen_extra_cubins[];
extern int attngen_extra_count;
}

// A linked-library failure: a TVM-FFI error where the host glue has TVM-FFI (always, in a library).
#ifdef TVM_FFI_THROW
#include "host_error.h"
#define ATTNGEN_LINKED_FAIL(msg) ATTNGEN_THROW(RuntimeError) << (msg)
#else
#define ATTNGEN_LINKED_FAIL(msg) throw std::runtime_error(msg)
#endif

namespace attngen {

// What launch_kernel_with asks of a launch. cooperative: CTAs that may wait on one another (a Hopper tail split's
// spread merge polls the counts of its item's other pieces), so that a grid the device cannot hold at once (fewer
// SMs under MPS or a green context) fails at the launch with cudaErrorCooperativeLaunchTooLarge instead of
// spinning until the trap. dependent (sm_90+): programmatic stream serialization, the kernel may launch while the
// kernel before it on the stream finishes and waits for it in grid_dependency_wait; where the driver refuses the
// attribute the launch is made again without it (a second failure reaches check_launch).
struct LaunchAttrs {
  bool cooperative = false;
  bool dependent = false;
};

// A kernel launch through the runtime API. The launchers use it, not <<<>>>: a launch through a function
// pointer with <<<>>> calls the pointer as the kernel's host stub, which a linked kernel (a cudaKernel_t
// handle) does not have; cudaLaunchKernelExC takes either.
template <class... Params, class... Args>
cudaError_t launch_kernel_with(LaunchAttrs with, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                               cudaStream_t stream, const Args&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch_kernel: one argument per kernel parameter");
  static_assert((std::is_same<Params, Args>::value && ...), "launch_kernel: arguments of the parameters' own types");
  void* argv[] = {const_cast<void*>(static_cast<const void*>(&args))...};
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (with.cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n++].val.cooperative = 1;
  }
  const unsigned without_dependent = n;
  if (with.dependent) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = n;
  cudaError_t err = cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), argv);
  if (err != cudaSuccess && err != cudaErrorCooperativeLaunchTooLarge && n > without_dependent) {
    cudaGetLastError();
    config.numAttrs = without_dependent;
    err = cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), argv);
  }
  return err;
}

template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          const Args&... args) {
  return launch_kernel_with(LaunchAttrs{}, kernel, grid, block, smem, stream, args...);
}

template <class T> constexpr const char* kernel_type_name();
template <> constexpr const char* kernel_type_name<float>() { return "float"; }
template <> constexpr const char* kernel_type_name<half>() { return "__half"; }
template <> constexpr const char* kernel_type_name<__nv_bfloat16>() { return "__nv_bfloat16"; }
// fp8 caches' element types (fp8_kv.cuh): a kernel's last template argument, K/V's type
template <> constexpr const char* kernel_type_name<__nv_fp8_e4m3>() { return "__nv_fp8_e4m3"; }
template <> constexpr const char* kernel_type_name<__nv_fp8_e5m2>() { return "__nv_fp8_e5m2"; }

inline void append_kernel_arg(std::string& key, int v) { key += ", " + std::to_string(v); }
inline void append_kernel_arg(std::string& key, bool v) { key += v ? ", true" : ", false"; }
inline void append_kernel_arg(std::string& key, const char* type_name) { (key += ", ") += type_name; }

// "<name><<element type>, <values...>>", as the build's kernel table spells it.
template <class T, class... Values>
std::string kernel_key(const char* name, Values... values) {
  std::string key = std::string(name) + "<" + kernel_type_name<T>();
  (append_kernel_arg(key, values), ...);
  return key + ">";
}

// Part `part`'s cubin for the current device: its exact arch, else the newest one of the same major below it.
inline const unsigned char* linked_cubin_for_device(int part) {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  const int sm = major * 10 + minor;
  const unsigned char* best = nullptr;
  int best_sm = -1;
  for (const AttngenLinkedCubin* c = attngen_linked_cubins; c->data; ++c) {
    if (c->part == part && c->sm / 10 == major && c->sm <= sm && c->sm > best_sm) best = c->data, best_sm = c->sm;
  }
  return best;
}

namespace {
// The loaded cubins and the kernels found so far. In an unnamed namespace: each library keeps its own
// (a function-local static of an inline function would be one object for every library in the process).
struct LinkedKernels {
  std::mutex mu;
  std::unordered_map<int64_t, cudaLibrary_t> libraries;  // by (device, part): the cubin differs by arch
  std::unordered_map<std::string, cudaKernel_t> kernels;
};

inline LinkedKernels& linked_kernels() {
  static LinkedKernels state;
  return state;
}
}  // namespace

// The kernel named by `key` in the linked cubin, as the launchers' function-pointer type (never to be
// called as a function: launch it with launch_kernel). Fails when the device has no cubin or the cubin
// lacks the kernel.
template <class Fn>
Fn linked_kernel(const std::string& key) {
  LinkedKernels& st = linked_kernels();
  auto& libraries = st.libraries;
  auto& kernels = st.kernels;
  std::lock_guard<std::mutex> lock(st.mu);
  int dev = 0;
  cudaGetDevice(&dev);
  const std::string slot = std::to_string(dev) + ":" + key;
  auto hit = kernels.find(slot);
  if (hit != kernels.end()) return reinterpret_cast<Fn>(hit->second);
  const char* mangled = nullptr;
  int part = -1;
  for (int i = 0; attngen_linked_kernels[2 * i]; ++i) {
    if (key != attngen_linked_kernels[2 * i]) continue;
    mangled = attngen_linked_kernels[2 * i + 1];
    part = attngen_linked_kernel_parts[i];
  }
  const unsigned char* cubin = mangled ? linked_cubin_for_device(part) : nullptr;
  int64_t lib_key = int64_t(dev) * 4096 + part;
  if (!cubin) {  // a part linked on first use: the registered cubin of the device's arch that holds the kernel
    const int n = __atomic_load_n(&attngen_extra_count, __ATOMIC_ACQUIRE);
    int major = 0, minor = 0, best_sm = -1;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    for (int i = 0; i < n; ++i) {
      const AttngenExtraCubin& c = attngen_extra_cubins[i];
      if (c.sm / 10 != major || c.sm > major * 10 + minor || c.sm <= best_sm) continue;
      for (int j = 0; j < c.num_kernels; ++j) {
        if (key != c.kernels[2 * j]) continue;
        cubin = c.data, mangled = c.kernels[2 * j + 1], best_sm = c.sm, lib_key = int64_t(dev) * 4096 + 2048 + i;
        break;
      }
    }
  }
  if (!cubin) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    bool arch_built = false;
    for (const AttngenLinkedCubin* c = attngen_linked_cubins; c->data; ++c) arch_built |= c->sm / 10 == major;
    if (!arch_built) ATTNGEN_LINKED_FAIL("attngen: this library holds no cubin for the current device's arch");
    ATTNGEN_LINKED_FAIL("attngen: this library holds no cubin with kernel " + key + " for the current device's arch "
                        "(a template it links on first use is linked by attngen's runtime when a plan asks for it: "
                        "plan_decode(tensor_cores=False), plan_prefill(template='mma_sync'); or build with "
                        "defer_alternatives=False / --link-alternatives)");
  }
  auto lib = libraries.find(lib_key);
  if (lib == libraries.end()) {
    cudaLibrary_t l = nullptr;
    cudaError_t err = cudaLibraryLoadData(&l, cubin, nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (err != cudaSuccess)
      ATTNGEN_LINKED_FAIL(std::string("attngen: loading the linked cubin failed: ") + cudaGetErrorString(err));
    lib = libraries.emplace(lib_key, l).first;
  }
  cudaKernel_t k = nullptr;
  cudaError_t err = cudaLibraryGetKernel(&k, lib->second, mangled);
  if (err != cudaSuccess)
    ATTNGEN_LINKED_FAIL("attngen: kernel " + key + " not found in the linked cubin: " + cudaGetErrorString(err));
  kernels.emplace(slot, k);
  return reinterpret_cast<Fn>(k);
}

// linked_kernel for one kernel (make_key: a lambda naming it, so that each kernel has its own cache),
// looked up once per device: the launchers call it on every launch. The launch object is compiled with
// hidden visibility (codegen/lto.py), so that the cache is this library's.
constexpr int kLinkedMaxDevices = 64;

template <class Fn, class MakeKey>
Fn linked_kernel_cached(MakeKey make_key) {
  static std::atomic<Fn> by_device[kLinkedMaxDevices];  // zero-initialised: static storage
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= kLinkedMaxDevices) return linked_kernel<Fn>(make_key());
  Fn k = by_device[dev].load(std::memory_order_acquire);
  if (!k) {
    k = linked_kernel<Fn>(make_key());
    by_device[dev].store(k, std::memory_order_release);
  }
  return k;
}

}  // namespace attngen
