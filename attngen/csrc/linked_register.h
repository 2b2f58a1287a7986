// The exported function through which attngen's runtime hands a linked library the cubin of a part it links
// on first use (codegen/lto.py link_deferred: on sm_90a the CUDA-core decode and the mma.sync prefill, which
// the automatic choice never takes). Host-only C++, included by the exports file alone; the registry
// itself is C in the library's link object (codegen/linked_cubin.py), where the launchers' kernel lookup
// (cubin_launch.h linked_kernel) reads it.
#pragma once
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <string>
#include <vector>

#include "host_error.h"

extern "C" int attngen_register_extra_cubin(const unsigned char* data, unsigned long size, int sm,
                                            const char* const* kernels, int num_kernels);

namespace {  // this library's own (the exports are compiled without hidden visibility)

// (cubin bytes, its arch as major * 10 + minor, [key, mangled name, key, mangled name, ...]) -> the number
// of cubins registered so far
inline int64_t register_linked_cubin(tvm::ffi::Bytes cubin, int64_t sm, tvm::ffi::Array<tvm::ffi::String> table) {
  if (table.size() % 2 != 0) ATTNGEN_THROW(ValueError) << "table: key / mangled-name pairs expected";
  std::vector<std::string> names(table.begin(), table.end());
  std::vector<const char*> ptrs;
  for (const std::string& n : names) ptrs.push_back(n.c_str());
  const int n = attngen_register_extra_cubin(reinterpret_cast<const unsigned char*>(cubin.data()), cubin.size(),
                                             int(sm), ptrs.data(), int(ptrs.size() / 2));
  if (n < 0)
    ATTNGEN_THROW(RuntimeError) << "attngen: the library could not take another cubin (64 at most, or memory is short)";
  return n;
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(attngen_register_linked_cubin, register_linked_cubin);
