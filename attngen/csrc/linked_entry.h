// The exported functions of a link-time build (codegen/lto.py), split so that a variant's new parameter
// list recompiles only a small host-only file:
//
// - the launch object (nvcc, once per hook signature, head dim, dtypes, layouts) instantiates the entry
//   templates (entry_decode.h, entry_prefill.h; over fp8 caches entry_decode_fp8.h, entry_prefill_fp8.h)
//   over BlockHooks<Hooks_d<D>>, whose one extra parameter is the packed ParamBlock, and defines
//   LinkedLaunch<Tag, Own>::run(own arguments..., block) per export;
// - the exports file (the host C++ compiler alone, per parameter list) exports LinkedEntry<...>::call,
//   with the same typed signature as a whole-program build's export (the entry's own arguments, then
//   the variant's), which packs the variant's parameters and calls run.
//
// This header is host-only C++: the exports file includes it without nvcc.
#pragma once
#include "hook_abi.h"
#include "variant_params.h"

namespace attngen {

using TV = tvm::ffi::TensorView;

// Each entry kind's own arguments, as its entry template's call takes them (the launch object
// static_asserts the agreement): the tensors up to lse, then (fp8 caches' entries, entry_decode_fp8.h and
// entry_prefill_fp8.h) k_scale and v_scale, then the scalars and optional tensors.
template <class... Tensors>
using DecodeOwnArgsWith = ArgList<Tensors..., double, TV, TV, int64_t, int64_t, tvm::ffi::Optional<TV>, int64_t,
                                  int64_t, int64_t>;
template <class... Tensors>
using PrefillOwnArgsWith = ArgList<Tensors..., double, int64_t, int64_t, int64_t, tvm::ffi::Optional<TV>,
                                   tvm::ffi::Optional<TV>, int64_t, tvm::ffi::Optional<TV>, tvm::ffi::Optional<TV>>;

using DecodeOwnArgs = DecodeOwnArgsWith<TV, TV, TV, TV, TV, TV, TV>;
using DecodeFP8OwnArgs = DecodeOwnArgsWith<TV, TV, TV, TV, TV, TV, TV, TV, TV>;
using PrefillPagedOwnArgs = PrefillOwnArgsWith<TV, TV, TV, TV, TV, TV, TV, TV>;
using PrefillPagedFP8OwnArgs = PrefillOwnArgsWith<TV, TV, TV, TV, TV, TV, TV, TV, TV, TV>;
using PrefillRaggedOwnArgs = PrefillOwnArgsWith<TV, TV, TV, TV, TV, TV, TV>;
using PrefillRaggedFP8OwnArgs = PrefillOwnArgsWith<TV, TV, TV, TV, TV, TV, TV, TV, TV>;
// the tile-map classifier's (entry_prefill.h TileMapEntry): qo_indptr, kv_len, map, row_keys, lists, room, then
// group, num_kv_heads, causal, rows, keys
using TileMapOwnArgs = ArgList<TV, TV, tvm::ffi::Optional<TV>, int64_t, TV, tvm::ffi::Optional<TV>,
                               tvm::ffi::Optional<TV>, tvm::ffi::Optional<TV>, int64_t, int64_t, int64_t, int64_t,
                               int64_t>;

// The launch object's entry template instance of an export (specialised there, per Tag).
template <class Tag>
struct LaunchEntryOf;

// One export's launch, defined in the launch object (explicit instantiation) and declared in the exports
// file (extern template). Hidden: each library binds to its own.
template <class Tag, class Own>
struct __attribute__((visibility("hidden"))) LinkedLaunch;

template <class Tag, class... O>
struct __attribute__((visibility("hidden"))) LinkedLaunch<Tag, ArgList<O...>> {
  static void run(O... own, const ParamBlock& block);
};

template <class Tag, class... O>
void LinkedLaunch<Tag, ArgList<O...>>::run(O... own, const ParamBlock& block) {
  using Entry = typename LaunchEntryOf<Tag>::type;
  static_assert(std::is_same<decltype(&Entry::call), void (*)(O..., const ParamBlock*)>::value,
                "the entry's own arguments differ from linked_entry.h's list");
  Entry::call(own..., &block);
}

// The exported function: the variant's parameters (P::ExtraArgs, packed by P::set_params) into the
// block, then the launch.
template <const char* Name, class P, class Tag, class Own, class Extra = typename P::ExtraArgs>
struct LinkedEntry;

template <const char* Name, class P, class Tag, class... O, class... X>
struct LinkedEntry<Name, P, Tag, ArgList<O...>, ArgList<X...>> {
  static void call(O... own, X... extra) {
    ParamBlock block;
    P::set_params(Name, block, extra...);
    LinkedLaunch<Tag, ArgList<O...>>::run(own..., block);
  }
};

// The launch object's traits: the ABI traits A (flags, device forwarding functions), kernels taken from
// the linked cubin, and the block as the one extra parameter.
template <class A>
struct BlockHooks : A {
  static constexpr bool kLinked = true;
  using ExtraArgs = ArgList<const ParamBlock*>;
  static void set_params(const char*, ParamBlock& p, const ParamBlock* block) { p = *block; }
};

}  // namespace attngen
