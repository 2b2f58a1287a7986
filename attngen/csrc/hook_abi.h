// The boundary between a prebuilt template and a variant's hooks in link-time builds
// (codegen/lto.py). A template compiled once for a hook signature never sees the variant's Params:
// its traits (Hooks_d<D> with Params = ParamBlock) forward each hook to an extern "C" device
// function attngen_abi_d<D>_<hook>(const ParamBlock*, ...), defined per variant in its hook object,
// which reads the block as the variant's own Params. nvJitLink -lto inlines those functions into the
// kernels, so the block's fields are read straight from the kernel parameters.
#pragma once
#ifndef __CUDACC_RTC__  // the hook objects compiled by nvrtc need only the block
#include <cstring>
#include <type_traits>

#include "trait_flag.h"
#endif

namespace attngen {

// The variant's Params, by value in the kernel's parameters. Its size bounds a linked variant's
// parameter struct (the build refuses larger ones; whole-program builds have no such bound).
constexpr int kParamBlockBytes = 256;

struct alignas(16) ParamBlock {
  unsigned char bytes[kParamBlockBytes];
};

#ifndef __CUDACC_RTC__
// A variant's Params copied into the block the linked kernels take.
template <class P>
void pack_params(ParamBlock& block, const P& params) {
  static_assert(sizeof(P) <= sizeof(ParamBlock), "the variant's Params do not fit the linked parameter block");
  static_assert(alignof(P) <= alignof(ParamBlock), "the variant's Params need more alignment than the block");
  static_assert(std::is_trivially_copyable<P>::value, "the variant's Params must be trivially copyable");
  std::memset(block.bytes, 0, sizeof(block.bytes));
  std::memcpy(block.bytes, &params, sizeof(P));
}

// Whether the traits V launch kernels from a linked cubin (V::kLinked) rather than their own
// instantiations: the launchers pick the kernel by name then, and the kernel templates are never
// instantiated in the host glue.
template <class V>
using LinkedFlag = std::bool_constant<V::kLinked>;

template <class V>
constexpr bool linked_hooks() {
  return trait_flag<V, LinkedFlag>();
}
#endif

}  // namespace attngen
