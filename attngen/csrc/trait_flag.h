// Compile-time flags that variant traits opt into: a traits struct (or a wrapper deriving from one, such as
// TvmWindowed<V>, tvm_traits.cuh) declares `static constexpr bool kX = ...;`, and the templates ask
// trait_flag<V, XFlag>(), which is false for traits without the member.
#pragma once
#include <type_traits>

namespace attngen {

// Flag<V> reads the member as an alias template, `template <class V> using XFlag = std::bool_constant<V::kX>;`:
// for traits without kX its substitution fails, which selects the false_type here instead of an error.
template <class V, template <class> class Flag, class = void>
struct TraitFlag : std::false_type {};
template <class V, template <class> class Flag>
struct TraitFlag<V, Flag, std::void_t<Flag<V>>> : Flag<V> {};

template <class V, template <class> class Flag>
constexpr bool trait_flag() {
  return TraitFlag<V, Flag>::value;
}

}  // namespace attngen
