// The traits wrappers that compile TVM PagedKVCache's conventions into attngen's templates, for the "tirx" slots
// (tvm_slots.h): TvmWindowed<V> (sliding windows, tvm_window.cuh), TvmTree<V> (token trees, tvm_tree.cuh) and
// TvmRope<V> (inline RoPE, tvm_rope.cuh), each a flag over the variant's traits V that the templates test with
// `if constexpr` (tvm_instance<V>(): any of them); every other instance is the plain kernel, unchanged.
#pragma once
#include <type_traits>

#include "trait_flag.h"

namespace attngen {

// The variant's traits V with TVM's sliding-window view and position window compiled into the templates.
template <class V>
struct TvmWindowed : V {
  static constexpr bool kTvmWindowed = true;
};

// The variant's traits V with TVM's token-tree mask compiled into the prefill template.
template <class V>
struct TvmTree : V {
  static constexpr bool kTvmTree = true;
};

// The variant's traits V with TVM's inline RoPE compiled into the templates.
template <class V>
struct TvmRope : V {
  static constexpr bool kTvmRope = true;
};

template <class V>
using TvmWindowedFlag = std::bool_constant<V::kTvmWindowed>;
template <class V>
using TvmTreeFlag = std::bool_constant<V::kTvmTree>;
template <class V>
using TvmRopeFlag = std::bool_constant<V::kTvmRope>;

template <class V>
constexpr bool tvm_windowed() {
  return trait_flag<V, TvmWindowedFlag>();
}

template <class V>
constexpr bool tvm_tree() {
  return trait_flag<V, TvmTreeFlag>();
}

template <class V>
constexpr bool tvm_rope() {
  return trait_flag<V, TvmRopeFlag>();
}

// Whether any of TVM's conventions is compiled into the traits V: such instances make no tile maps and keep
// to fewer tile configurations (prefill_launch.cuh).
template <class V>
constexpr bool tvm_instance() {
  return tvm_windowed<V>() || tvm_tree<V>() || tvm_rope<V>();
}

}  // namespace attngen
