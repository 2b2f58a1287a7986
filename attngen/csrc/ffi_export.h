// ATTNGEN_EXPORT_TYPED_FUNC(name, function): exports `function` as `__tvm_ffi_<name>`, TVM-FFI's safe-call
// ABI, with TVM_FFI_DLL_EXPORT_TYPED_FUNC's argument conversions and refusals ("Mismatched number of
// arguments when calling: `name(signature)`...", "Mismatched type on argument #i ..."), errors raised as
// its are. The difference is where the code lives: each argument is converted by one out-of-line function
// per argument type, and each refusal is built out of line, where TVM's macro inlines, for every argument
// of every export, a message listing the whole signature (quadratic in the arguments; with the 12-20
// arguments of attention entries that cold code was most of a TU's host object and host compile time).
#pragma once
#include <tvm/ffi/any.h>
#include <tvm/ffi/function.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "host_error.h"

namespace attngen::ffi_export {

using tvm::ffi::AnyView;
using tvm::ffi::detail::FGetFuncSignature;

[[noreturn, gnu::cold, gnu::noinline]] inline void wrong_count(const char* name, FGetFuncSignature sig,
                                                                uint64_t want, int32_t got) {
  ATTNGEN_THROW(TypeError) << "Mismatched number of arguments when calling: `" << name << sig() << "`. Expected "
                           << want << " but got " << got << " arguments";
  __builtin_unreachable();  // the statement above throws
}

template <class T>
[[noreturn, gnu::cold, gnu::noinline]] void wrong_type(const char* name, FGetFuncSignature sig, int32_t index,
                                                       const AnyView& value) {
  TVMFFIAny raw = value.CopyToTVMFFIAny();
  ATTNGEN_THROW(TypeError) << "Mismatched type on argument #" << index << " when calling: `" << name << sig()
                           << "`. Expected `" << tvm::ffi::detail::Type2Str<T>::v() << "` but got `"
                           << tvm::ffi::TypeTraits<T>::GetMismatchTypeInfo(&raw) << "`";
  __builtin_unreachable();  // the statement above throws
}

// argument `index` as T (the conversions TVM-FFI's typed functions make)
template <class T>
[[gnu::noinline]] T arg(const AnyView* args, int32_t index, const char* name, FGetFuncSignature sig) {
  if constexpr (std::is_same_v<T, AnyView>) {
    return args[index];
  } else if constexpr (std::is_same_v<T, tvm::ffi::Any>) {
    return tvm::ffi::Any(args[index]);
  } else {
    std::optional<T> value = args[index].template try_cast<T>();
    if (!value.has_value()) wrong_type<T>(name, sig, index, args[index]);
    return *std::move(value);
  }
}

template <auto F, class R, class... A, std::size_t... Is>
int call(R (*)(A...), std::index_sequence<Is...>, const char* name, const TVMFFIAny* packed, int32_t num_args,
         TVMFFIAny* result) {
  using Info = tvm::ffi::detail::FunctionInfo<R (*)(A...)>;
  try {
    if (num_args != static_cast<int32_t>(sizeof...(A))) wrong_count(name, Info::Sig, sizeof...(A), num_args);
    const AnyView* args = reinterpret_cast<const AnyView*>(packed);
    // braced: converted left to right, so the first wrong argument is the one named
    std::tuple<std::decay_t<A>...> values{arg<std::decay_t<A>>(args, Is, name, Info::Sig)...};
    if constexpr (std::is_void_v<R>) {
      F(std::get<Is>(std::move(values))...);
    } else {
      *reinterpret_cast<tvm::ffi::Any*>(result) = R(F(std::get<Is>(std::move(values))...));
    }
    return 0;
  } catch (const tvm::ffi::Error& err) {
    tvm::ffi::detail::SetSafeCallRaised(err);
    return -1;
  } catch (const std::exception& ex) {
    tvm::ffi::detail::SetSafeCallRaised(tvm::ffi::Error("InternalError", ex.what(), ""));
    return -1;
  }
}

}  // namespace attngen::ffi_export

#define ATTNGEN_EXPORT_TYPED_FUNC(ExportName, Function)                                                      \
  extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_##ExportName(void*, const TVMFFIAny* args, int32_t num_args,  \
                                                           TVMFFIAny* result) {                           \
    return ::attngen::ffi_export::call<Function>(Function, std::make_index_sequence<                      \
        ::tvm::ffi::detail::FunctionInfo<std::decay_t<decltype(Function)>>::num_args>{}, #ExportName, args, \
        num_args, result);                                                                                 \
  }
